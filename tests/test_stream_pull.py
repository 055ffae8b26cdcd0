"""Streamed deltas (storage/weights/stream_pull.py): a receiver waiting for a version applies
its buckets as they are published, before the manifest, and still ends bit-exact or with a full
snapshot; never with a version it does not wholly hold."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from storage.weights.versions import announce_key, bucket_key, manifest_key, read_manifest
from storage.weights.receiver import WeightReceiver
from storage.weights.digest import tensors_digest
from storage.weights.sparse_publisher import SparsePublisher

from mooncake_fixtures import mooncake, mooncake_pair, mooncake_shared_pair, ns, relays  # noqa: F401 (fixtures)
from test_weight_pipeline import SMALL, Flipping, Wrapped
from weight_fixtures import Training, run_name, same, served  # noqa: F401 (fixture)


class SlowPuts(Wrapped):
    """Bucket puts take `delay_s` longer (a slow link); records whether the receiver had
    applied anything of the version when its manifest went in."""

    def __init__(self, inner, delay_s: float = 0.05) -> None:
        super().__init__(inner)
        self.delay_s, self.on_manifest = delay_s, []
        self.watch = None

    def put(self, key, data):
        if "/bucket-" in key and not key.endswith(".info"):
            time.sleep(self.delay_s)
        if key.endswith("/manifest") and self.watch is not None:
            self.on_manifest.append(self.watch())
        self.inner.put(key, data)


def _pull_in_thread(rx: WeightReceiver, version: int, await_s: float = 30.0):
    out: dict = {}

    def run() -> None:
        try:
            out["report"] = rx.pull(version, accept_newer=True, await_s=await_s)
        except Exception as e:  # handed to the test
            out["error"] = e
    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def _setup(relays, ns, slow: float = 0.05):
    writer, reader = relays
    run = run_name(ns)
    link = SlowPuts(writer, slow)
    pub = SparsePublisher(link, run, bucket_bytes=SMALL)
    train = Training(5)
    v0 = train.weights()
    pub.publish(0, v0)
    rx = WeightReceiver(reader, run, full_timeout_s=5)
    assert rx.pull(0).mode == "full"
    train.step(3e-2)  # large steps: the delta fills several buckets
    return link, run, pub, rx, train.weights()


def test_a_waiting_receiver_applies_buckets_before_the_manifest_bit_exact(relays, ns):
    link, run, pub, rx, v1 = _setup(relays, ns)
    link.watch = lambda: rx.version  # what the receiver claims as the manifest goes in
    thread, out = _pull_in_thread(rx, 1)
    time.sleep(0.1)  # the receiver waits for a version not begun yet
    assert "report" not in out and "error" not in out
    report = pub.publish(1, v1)
    thread.join(60)
    assert "error" not in out, out.get("error")
    got = out["report"]
    manifest = read_manifest(relays[1], run, 1)
    assert len(manifest.buckets) >= 4 and manifest.meta["kind"] == "delta"
    # the receiver's work overlapped the publish: buckets went in before the manifest existed
    assert got.mode == "delta" and not got.fallback and got.streamed >= 2
    assert got.buckets == len(manifest.buckets)
    # every bucket's get was timed, streamed or not (the link's get leg: link_rate.py)
    assert got.get_bytes == got.bytes and 0 < got.get_s <= got.fetch_s
    assert link.on_manifest == [0]  # half applied, it still claimed only v0: never v1 early
    assert rx.version == 1 and same(rx.tensors, v1)
    assert rx.digest == report.digest == tensors_digest(v1)


def test_a_slow_stream_is_polled_at_an_eighth_of_its_gaps_not_every_millisecond(relays, ns):
    """Buckets 0.15 s apart: the receiver checks for the next one from every ms just after one
    landed, backing off to an eighth of the gap (19 ms): ~12 checks a gap where a fixed 2 ms
    poll made ~70 (the relay's master answers each, for every receiver)."""
    link, run, pub, rx, v1 = _setup(relays, ns, slow=0.15)
    thread, out = _pull_in_thread(rx, 1)
    pub.publish(1, v1)
    thread.join(60)
    got = out["report"]
    assert got.mode == "delta" and not got.fallback and got.streamed >= 3
    gaps = got.buckets + 1  # before each bucket, and before the manifest
    assert 0 < got.polls <= 20 * gaps, (got.polls, gaps)  # 2 ms polls: >= 0.15 / 0.0021 a gap
    assert rx.version == 1 and same(rx.tensors, v1)


def test_damaged_bucket_in_the_stream_is_fetched_again(relays, ns):
    link, run, pub, rx, v1 = _setup(relays, ns)
    rx.relay = Flipping(relays[1], bucket_key(run, 1, 1))
    thread, out = _pull_in_thread(rx, 1)
    pub.publish(1, v1)
    thread.join(60)
    got = out["report"]
    assert got.rejected == 1 and got.streamed >= 1 and not got.fallback
    assert got.get_bytes == got.bytes  # the rejected copy crossed the link too
    assert rx.version == 1 and same(rx.tensors, v1)


def test_a_publish_started_again_mid_stream_ends_in_a_full_snapshot(relays, ns, served):
    """The first attempt dies after a few buckets; the version is published again with other
    bits. The receiver, half applied, must not take the second attempt's remaining buckets onto
    the first's: it holds no version, then the full snapshot of what was finally published."""
    link, run, pub, rx, v1 = _setup(relays, ns)
    served.append(pub)
    pub.start_server(interval_s=0.02)
    thread, out = _pull_in_thread(rx, 1)
    real_put, puts = link.put, []

    def dying_put(key, data):
        if "/v1/bucket-" in key and not key.endswith(".info"):
            puts.append(key)
            if len(puts) == 4:
                raise OSError("link dropped")
        real_put(key, data)
    link.put = dying_put
    with pytest.raises(OSError, match="link dropped"):
        pub.publish(1, v1)
    time.sleep(0.3)  # the receiver has applied the first buckets by now
    assert rx.version is None or rx.version == 0
    link.put = real_put
    other = {n: t.clone() for n, t in v1.items()}
    other["model.layers.0.self_attn.q_proj.weight"][0, :4] = 1.0
    pub.publish(1, other)
    thread.join(60)
    assert "error" not in out, out.get("error")
    got = out["report"]
    assert got.mode == "full" and "streamed" in got.fallback
    assert rx.version == 1 and same(rx.tensors, other)


def test_a_receiver_that_holds_another_base_does_not_stream(relays, ns, served):
    link, run, pub, rx, v1 = _setup(relays, ns, slow=0.0)
    served.append(pub)
    pub.start_server(interval_s=0.02)
    rx.version, rx.broken = None, "as after a failed pull"  # the delta onto v0 is not for it
    thread, out = _pull_in_thread(rx, 1)
    pub.publish(1, v1)
    thread.join(60)
    got = out["report"]
    assert got.streamed == 0 and got.mode == "full" and rx.version == 1 and same(rx.tensors, v1)


def test_waiting_for_a_version_never_published_times_out_clearly(relays, ns):
    link, run, pub, rx, v1 = _setup(relays, ns, slow=0.0)
    with pytest.raises(TimeoutError, match="v1 was not published within 0.2 s"):
        rx.pull(1, await_s=0.2)
    assert rx.version == 0
    assert not relays[1].exists(announce_key(run, 1))
    assert not relays[1].exists(manifest_key(run, 1))


EMBED = "model.embed_tokens.weight"


def _blocks_small(monkeypatch):
    from storage.delta import blocks

    monkeypatch.setattr(blocks, "SPLIT_BYTES", 16 << 10)  # the 38 KB embedding: 5 blocks
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 8 << 10)
    return blocks


def test_a_large_tensor_in_blocks_streams_and_applies_in_place(relays, ns, monkeypatch):
    """The product path with blocks (storage/weights/spans.py): in a streamed delta a tensor
    over the split size goes out as its blocks, each an entry of its own over its range, and
    the waiting receiver applies them into its held tensor as they land, bit-exact."""
    from storage.delta import read_header

    blocks = _blocks_small(monkeypatch)
    link, run, pub, rx, v1 = _setup(relays, ns, slow=0.0)
    held = rx.tensors[EMBED]
    thread, out = _pull_in_thread(rx, 1)
    report = pub.publish(1, v1)
    thread.join(60)
    assert "error" not in out, out.get("error")
    assert out["report"].mode == "delta" and not out["report"].fallback
    spans = [(b, e) for b, e in read_manifest(relays[1], run, 1).entries() if e.name == EMBED]
    numel = v1[EMBED].numel()
    assert [e.meta["span"] for _, e in spans] == \
        [list(r) for r in blocks.ranges(numel, v1[EMBED].element_size())]  # cover it, in order
    assert len(spans) == 5 and len({b.index for b, _ in spans}) >= 2  # several buckets
    for bucket, entry in spans:
        assert entry.meta["shape"] == list(v1[EMBED].shape)  # the whole tensor's
        blob = memoryview(relays[1].get(bucket_key(run, 1, bucket.index)))
        head = read_header(blob[entry.offset:entry.offset + entry.length])
        start, end = entry.meta["span"]
        assert head.encoding != "blocks" and head.numel == end - start
    # one row per tensor in the report, its blocks' sizes summed
    [stat] = [t for t in report.tensors if t.name == EMBED]
    assert len(report.tensors) == len(v1) and stat.numel == numel
    assert stat.encoding in ("ef", "ternary")  # what its blocks are coded as, for the model
    assert report.digest == tensors_digest(v1)  # made of the blocks' hashes: the same digest
    assert rx.tensors[EMBED] is held  # applied in place
    assert rx.version == 1 and same(rx.tensors, v1) and rx.digest == tensors_digest(v1)
    # the tensors coded in blocks go out last (the embedding heads the model), so the
    # buckets before them reach the receiver while their blocks are coded
    order = [e.name for _, e in read_manifest(relays[1], run, 1).entries()]
    in_blocks = [blocks.splits(v1[n].numel() * v1[n].element_size()) for n in order]
    assert any(in_blocks) and not all(in_blocks)
    assert in_blocks == sorted(in_blocks)  # never one in blocks before one that is not
    assert order[in_blocks.index(True):][0] == "model.embed_tokens.weight"


@pytest.mark.parametrize("pipelined", [True, False])
def test_a_receiver_pulling_a_streamed_version_once_complete_assembles_its_blocks(
        relays, ns, monkeypatch, pipelined):
    """A receiver that was not waiting pulls the version with its spans after the manifest:
    pipelined into its held weights, or all at once into new tensors (pull_weights)."""
    _blocks_small(monkeypatch)
    link, run, pub, rx, v1 = _setup(relays, ns, slow=0.0)
    rx.pipelined = pipelined
    before = rx.tensors[EMBED].clone()
    pub.publish(1, v1)
    assert sum(e.name == EMBED for _, e in read_manifest(relays[1], run, 1).entries()) == 5
    got = rx.pull(1)
    assert got.mode == "delta" and not got.fallback
    assert rx.version == 1 and same(rx.tensors, v1) and rx.digest == tensors_digest(v1)
    assert not torch.equal(before, rx.tensors[EMBED])  # it moved: the check is not vacuous


def test_a_span_outside_its_tensor_is_refused(relays, ns, monkeypatch):
    """A span entry whose range is not one of its tensor's is a corrupt bucket, named."""
    from storage.weights.buckets import CorruptBucket
    from storage.weights.spans import span_of

    assert span_of("w", {"shape": [4, 4]}, 16) is None
    assert span_of("w", {"span": [0, 8]}, 16) == (0, 8)
    for bad in ([8, 8], [-1, 4], [0, 17], [0], "0:8", [0.0, 8]):
        with pytest.raises(CorruptBucket, match="'w'"):
            span_of("w", {"span": bad}, 16)
