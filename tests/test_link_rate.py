"""The measured link rate (storage/weights/link_rate.py): transfers timed on both legs, the
publisher choosing by the slower one once measured, the configured rate until then.

The slow link below is a filesystem relay that sleeps to hold each put or get to a rate: it
stands in for a cross-cluster link, which this machine cannot run."""
from __future__ import annotations

import threading
import time

import pytest

from core.config import PublishConfig
from storage.relay.filesystem import FilesystemRelay
from storage.weights.link_rate import LinkRate, TransferClock
from storage.weights.receiver import WeightReceiver
from storage.weights.sparse_publisher import SparsePublisher
from test_transfer_by_time import bits, entry_encodings, versions

MB = 1 << 20


class SlowLink(FilesystemRelay):
    """Puts held to `put_gbps` and gets to `get_gbps` (a WAN link's stand-in, see above)."""

    def __init__(self, root, put_gbps: float | None = None, get_gbps: float | None = None):
        super().__init__(root)
        self.put_gbps, self.get_gbps = put_gbps, get_gbps

    @staticmethod
    def _hold(start: float, nbytes: int, gbps: float | None) -> None:
        if gbps:
            time.sleep(max(0.0, start + nbytes * 8 / (gbps * 1e9) - time.perf_counter()))

    def put(self, key, data):
        start = time.perf_counter()
        super().put(key, data)
        self._hold(start, memoryview(data).nbytes, self.put_gbps)

    def get_many(self, keys):
        start = time.perf_counter()
        out = super().get_many(keys)
        self._hold(start, sum(v.nbytes for v in out), self.get_gbps)
        return out


def test_clock_counts_overlapping_transfers_once():
    clock = TransferClock()
    clock.add(10, 0.0, 2.0)
    clock.add(10, 1.0, 3.0)   # overlaps the first: the link was busy 0-3 s
    clock.add(10, 5.0, 6.0)   # after a wait that is not counted
    clock.add(0, 5.2, 5.5)    # inside the last one
    assert clock.bytes == 30 and clock.seconds == pytest.approx(4.0)
    with pytest.raises(ValueError, match="before it starts"):
        clock.add(1, 2.0, 1.0)


def test_clock_takes_transfers_from_threads():
    clock = TransferClock()

    def transfers(first: float) -> None:
        for i in range(500):
            clock.add(1, first + i, first + i + 0.5)
    threads = [threading.Thread(target=transfers, args=(k * 0.25,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # each second, [i, i+0.5] and [i+0.25, i+0.75] overlap into 0.75 s
    assert clock.bytes == 1000 and clock.seconds == pytest.approx(500 * 0.75)


def test_rate_is_configured_until_measured_then_the_slower_legs_median():
    rate = LinkRate(min_bytes=MB, window=3)
    assert rate.gbps(10.0) == 10.0 and rate.as_dict() == {"put_gbps": None, "get_gbps": None}
    assert not rate.observe("put", MB - 1, 1e-3)  # too small to tell bandwidth from latency
    assert not rate.observe("get", 8 * MB, 0.0)
    assert rate.gbps(10.0) == 10.0
    assert rate.observe("put", 125 * MB // 100, 1e-3)  # ~10.5 Gbps
    # the get leg is not measured yet: it counts as the configured rate
    assert rate.gbps(5.0) == 5.0 and rate.gbps(100.0) == pytest.approx(10.49, rel=0.01)
    for seconds in (0.1, 0.2, 0.05):  # 8 MB: 0.67, 0.34, 1.34 Gbps
        rate.observe("get", 8 * MB, seconds)
    assert rate.leg_gbps("get") == pytest.approx(8 * MB * 8 / 0.1 / 1e9)  # the median
    assert rate.gbps(10.0) == rate.leg_gbps("get")
    for _ in range(3):  # the window keeps the last 3: the link got faster
        rate.observe("get", 8 * MB, 0.001)
    assert rate.leg_gbps("get") == pytest.approx(67.1, rel=0.01)
    assert rate.gbps(100.0) == rate.leg_gbps("put")
    with pytest.raises(ValueError, match="leg"):
        rate.observe("push", 8 * MB, 1.0)
    with pytest.raises(ValueError):
        LinkRate(window=0)


def test_measure_link_is_on_by_default():
    assert PublishConfig().measure_link is True
    assert PublishConfig(measure_link=False).measure_link is False


def test_publisher_chooses_by_the_rate_its_puts_measure(tmp_path):
    """Configured at 1000 Gbps, a delta where a third of the elements moved goes raw; once
    the full snapshot's puts measure the link at ~0.3 Gbps, the next delta codes them."""
    old, new = versions(moved=0.3)
    relay = SlowLink(tmp_path / "relay", put_gbps=0.3)
    fixed = SparsePublisher(relay, "fixed", link_gbps=1000.0, workers=1)
    measured = SparsePublisher(relay, "measured", link_gbps=1000.0, workers=1,
                               link_rate=LinkRate(min_bytes=MB))  # the model here is 1.3 MB
    for pub in (fixed, measured):
        first = pub.publish(0, old)
        assert first.kind == "full" and first.link_gbps is None  # a snapshot: nothing to choose
    assert fixed.link_rate is None
    put_gbps = measured.link_rate.leg_gbps("put")
    # held to 0.3 Gbps, slower still when the filesystem is (a busy disk: not bounded below)
    assert put_gbps is not None and 0 < put_gbps <= 0.31
    fixed_report, measured_report = fixed.publish(1, new), measured.publish(1, new)
    assert fixed_report.link_gbps == 1000.0
    assert measured_report.link_gbps == pytest.approx(measured.link_rate.gbps(1000.0))
    assert measured_report.link_gbps < 0.31 and measured_report.summary()["link_gbps"] < 0.31
    embed = "model.embed_tokens.weight"
    assert entry_encodings(relay, "fixed", 1)[embed] == "raw"
    assert entry_encodings(relay, "measured", 1)[embed] not in ("raw", "dense")
    assert measured_report.pushed_bytes < fixed_report.pushed_bytes
    rx = WeightReceiver(relay, "measured", workers=1)
    rx.pull(0)
    assert rx.pull(1).mode == "delta"
    assert all(bits(rx.tensors[n]) == bits(new[n]) for n in new)


def test_receivers_gets_are_the_other_leg(tmp_path):
    """The publisher's puts are fast, the engines' gets slow: the gets set the rate."""
    old, new = versions(moved=0.3)
    relay = SlowLink(tmp_path / "relay", put_gbps=2.0, get_gbps=0.2)
    pub = SparsePublisher(relay, "run", link_gbps=10.0, workers=1,
                          link_rate=LinkRate(min_bytes=MB))
    pub.publish(0, old)
    rx = WeightReceiver(relay, "run", workers=1)
    report = rx.pull(0)
    dense = sum(t.numel() * t.element_size() for t in old.values())
    assert dense <= report.get_bytes <= report.bytes  # the buckets, padding included
    assert report.get_s >= report.get_bytes * 8 / 0.2e9 * 0.99
    assert report.get_s <= report.fetch_s + 1e-6  # gets alone, without the checksums
    put = pub.link_rate.leg_gbps("put")
    assert put <= 2.05 and pub.link_rate.gbps(10.0) == put  # the get leg: 10 until measured
    assert pub.observe_gets(report.get_bytes, report.get_s)
    assert not pub.observe_gets(1000, 1e-3)  # too small to count
    get = pub.link_rate.leg_gbps("get")
    assert 0 < get <= 0.21 and pub.link_rate.gbps(10.0) == min(put, get)
    assert pub.publish(1, new).link_gbps <= 0.21
    delta = rx.pull(1)
    assert delta.mode == "delta" and delta.get_bytes == delta.bytes and delta.get_s > 0
    assert all(bits(rx.tensors[n]) == bits(new[n]) for n in new)


def test_a_sharded_publishers_parts_share_one_measured_link(tmp_path):
    """publish.shard_split: every part's puts and the ranks' gets measure one link, which the
    next version's parts all choose by."""
    from storage.shards.grain import PublishLayout
    from storage.shards.layout import ParallelLayout
    from storage.shards.plan import param_specs
    from storage.shards.rules import infer_model_rules
    from storage.weights.sharded_publisher import ShardedPublisher
    from storage.weights.sharded_versions import commit_sharded
    from storage.weights.sharded_receiver import ShardedReceiver
    from storage.weights.transfer_metrics import PublishReport
    from test_sharded_publish import _step, _tiny

    relay = SlowLink(tmp_path / "relay", put_gbps=0.05, get_gbps=0.02)
    model, full = _tiny()
    specs = param_specs(full.items(), infer_model_rules(model, model.config))
    layout = PublishLayout(ParallelLayout(1), split=2)
    pub = ShardedPublisher(relay, "run", layout, (0, 0, 0), specs, link_gbps=1000.0,
                           link_rate=LinkRate(min_bytes=32 << 10))  # a tiny model
    parts = pub.publish(0, full)
    commit_sharded(relay, "run", 0, layout, specs)
    assert len(parts) >= 2 and all(p.link_rate is pub.link_rate for p in pub._pubs.values())
    put = pub.link_rate.leg_gbps("put")
    assert put is not None and put <= 0.051
    ranks = [ShardedReceiver(relay, "run", ParallelLayout(2), (t, 0, 0)) for t in range(2)]
    for rank in ranks:
        report = rank.pull()
        assert report.get_bytes == report.bytes and report.get_s > 0
        pub.observe_gets(report.get_bytes, report.get_s)
    assert pub.link_rate.leg_gbps("get") <= 0.021
    nxt = {n: _step(t) for n, t in full.items()}
    combined = PublishReport.combine(1, list(pub.publish(1, nxt).values()), "", 0.0)
    assert combined.link_gbps == pytest.approx(pub.link_rate.leg_gbps("get"))


def test_a_clock_crosses_a_process_pipe():
    """A pull's stats (its clock included) are sent from a bench's reader process."""
    import pickle

    clock = TransferClock()
    clock.add(10, 0.0, 2.0)
    clock.add(5, 1.0, 3.0)
    copy = pickle.loads(pickle.dumps(clock))
    assert (copy.bytes, copy.seconds) == (15, pytest.approx(3.0))
    copy.add(1, 4.0, 5.0)  # and takes transfers of its own
    assert (copy.bytes, copy.seconds, clock.bytes) == (16, pytest.approx(4.0), 15)
