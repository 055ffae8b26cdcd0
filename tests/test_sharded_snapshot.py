"""Sharded versions a receiver cannot apply as published: it skipped a version, holds nothing,
or a part's bucket is damaged or lost. It then takes that part alone as a full snapshot, asked
of the part's publisher, and ends bit-exact; with no publisher answering it fails loudly and
keeps what it held."""
from __future__ import annotations

import time

import pytest
import torch

from storage.relay.filesystem import FilesystemRelay
from storage.shards.grain import PublishLayout
from storage.shards.layout import ParallelLayout
from storage.shards.plan import param_specs, split_full
from storage.shards.rules import infer_model_rules
from storage.weights.versions import bucket_key, latest_version, read_manifest
from storage.weights.sharded_publisher import ShardedPublisher
from storage.weights.sharded_receiver import NeedsFullSnapshot, ShardedReceiver

from test_sharded_publish import _same, _step, _tiny

RUN = "snap"


@pytest.fixture
def published(tmp_path):
    """A TP=1 trainer publishing at grain 2, serving full snapshots of its parts; `publish(v)`
    pushes and commits version v (v steps from the tiny policy) and returns its weights."""
    relay = FilesystemRelay(tmp_path / "relay")
    model, full = _tiny()
    specs = param_specs(full.items(), infer_model_rules(model, model.config))
    layout = PublishLayout(ParallelLayout(1), split=2)
    pub = ShardedPublisher(relay, RUN, layout, (0, 0, 0), specs, bucket_bytes=16 << 10)

    def publish(version: int) -> dict[str, torch.Tensor]:
        weights = full
        for _ in range(version):
            weights = {n: _step(t) for n, t in weights.items()}
        pub.publish(version, weights)
        pub.commit(version)
        return weights

    pub.start_servers(interval_s=0.02)
    try:
        yield relay, pub, specs, publish
    finally:
        pub.stop_servers()


def test_receiver_that_skipped_a_version_takes_full_parts_bit_exact(published) -> None:
    relay, _, _, publish = published
    rx = ShardedReceiver(relay, RUN, full_timeout_s=30)
    publish(0)
    assert rx.pull().mode == "full" and not rx.pull().fallback  # as published, then a no-op
    publish(1)
    v2 = publish(2)  # v2's parts are deltas onto v1, which this receiver never held
    report = rx.pull(1, accept_newer=True)
    assert report.version == 2 and report.mode == "full" and "delta onto v1" in report.fallback
    assert all(p.endswith("/full") for p in report.parts) and _same(rx.tensors, v2)
    v3 = publish(3)  # and it is back on deltas
    again = rx.pull()
    assert again.mode == "delta" and not again.fallback and _same(rx.tensors, v3)


def test_late_tp2_rank_gets_only_its_parts_in_full(published) -> None:
    relay, _, specs, publish = published
    publish(0)
    v1 = publish(1)
    late = ShardedReceiver(relay, RUN, ParallelLayout(2), (1, 0, 0), full_timeout_s=30)
    report = late.pull()
    assert report.parts == ["shards/r0.0.0/all/full", "shards/r0.0.0/g1/full"]
    assert _same(late.tensors, {p.name: split_full(v1[p.name], p.rule, 2)[1] for p in specs})
    whole = sum(read_manifest(relay, RUN, 0, part).nbytes for part in
                ("shards/r0.0.0/all", "shards/r0.0.0/g0", "shards/r0.0.0/g1"))  # v0: full parts
    assert 0.45 < report.bytes / whole < 0.55, (report.bytes, whole)


@pytest.mark.parametrize("damage", ["flip", "lose"])
def test_damaged_part_is_replaced_by_its_full_snapshot(published, damage) -> None:
    relay, _, _, publish = published
    rx = ShardedReceiver(relay, RUN, full_timeout_s=30)
    publish(0)
    rx.pull()
    v1 = publish(1)
    part = "shards/r0.0.0/g0"
    key = bucket_key(RUN, 1, 0, part)
    if damage == "flip":
        blob = bytearray(relay.get(key))
        blob[len(blob) // 2] ^= 0x10
        relay.put(key, blob)
    else:
        relay.remove(key)
    report = rx.pull()
    assert report.mode == "mixed" and f"{part}/full" in report.parts and part not in report.parts
    assert "shards/r0.0.0/g1" in report.parts  # the other parts still came as deltas
    assert _same(rx.tensors, v1)


def test_no_snapshot_served_fails_and_keeps_what_was_held(published) -> None:
    relay, pub, _, publish = published
    pub.stop_servers()
    v0 = publish(0)
    rx = ShardedReceiver(relay, RUN, full_timeout_s=0.3)
    rx.pull()
    publish(1)
    publish(2)
    with pytest.raises(NeedsFullSnapshot, match="is its publisher serving requests"):
        rx.pull()
    assert rx.version == 0 and _same(rx.tensors, v0)


class _LosesFirstRequests(FilesystemRelay):
    """A relay that drops the first `n` snapshot requests put into it (a master restart)."""

    def __init__(self, root, n: int) -> None:
        super().__init__(root)
        self.dropped, self.n = 0, n

    def put(self, key: str, data) -> None:
        if key.endswith("full-request") and self.dropped < self.n:
            self.dropped += 1
            return
        super().put(key, data)


def test_a_lost_snapshot_request_is_asked_again(published) -> None:
    relay, _, _, publish = published
    publish(0)
    publish(1)
    v2 = publish(2)
    lossy = _LosesFirstRequests(relay.root, n=2)  # the same relay directory, losing 2 requests
    rx = ShardedReceiver(lossy, RUN, full_timeout_s=30)
    report = rx.pull()  # holds nothing: v2's parts are deltas, so it asks for them in full
    assert lossy.dropped == 2 and report.version == 2 and _same(rx.tensors, v2)


def test_a_version_the_relay_lost_is_put_back_whole(published) -> None:
    relay, pub, _, publish = published
    publish(0)
    v1 = publish(1)
    assert pub.whole and pub.committed == 1
    relay.remove_prefix(f"rose/{RUN}/")  # the relay lost everything (a master restart)
    assert latest_version(relay, RUN) is None
    deadline = time.monotonic() + 20
    while latest_version(relay, RUN) != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    rx = ShardedReceiver(relay, RUN)  # asks for no snapshot: takes the parts as pushed
    report = rx.pull()
    assert report.version == 1 and report.mode == "full" and _same(rx.tensors, v1)
