"""Sparse weight publishing end to end: deltas after a full snapshot, applied only onto their
base, bit-exact over several versions through the filesystem and the real Mooncake relay; any
damage, loss or skew falls back to a full snapshot and never leaves a partial version."""
from __future__ import annotations

import json
import time

import pytest
import torch

from storage.weights.buckets import Manifest
from storage.delta import DeltaBaseMismatch
from storage.relay.filesystem import FilesystemRelay
from storage.weights.sparse_publisher import SparsePublisher
from storage.weights.transfer_metrics import changed_count
from storage.weights.apply_pipeline import pull_weights
from storage.weights.versions import bucket_key, manifest_key, read_manifest, request_key
from storage.weights.receiver import SnapshotUnavailable, WeightReceiver

from mooncake_fixtures import mooncake, mooncake_pair, mooncake_shared_pair, ns, relays, skip_without_mooncake  # noqa: F401
from weight_fixtures import Training, bits, run_name, same, served  # noqa: F401


def test_delta_round_trip_bit_exact_over_versions(relays, ns):
    writer, reader = relays
    run = run_name(ns)
    pub = SparsePublisher(writer, run, bucket_bytes=32 << 10)
    rx = WeightReceiver(reader, run, full_timeout_s=1)
    train = Training()
    sizes, prev = [], None
    for v in range(5):
        if v:
            train.step()
        want = train.weights()
        report = pub.publish(v, want)
        got = rx.pull(v)
        assert report.kind == ("full" if v == 0 else "delta")
        assert got.mode == report.kind and got.version == v and not got.fallback
        assert rx.version == v and same(rx.tensors, want)
        manifest = read_manifest(reader, run, v)
        assert manifest.meta["kind"] == report.kind
        assert manifest.meta["base_version"] == (None if v == 0 else v - 1)
        sizes.append(report.pushed_bytes)
        if prev is not None:  # the stats count exactly the elements whose bits moved
            summary = report.summary()
            assert summary["changed"] == sum(changed_count(want[n], prev[n]) for n in want)
            assert 0 < summary["density"] < 1
        prev = want
    assert max(sizes[1:]) < sizes[0] / 2  # deltas are much smaller than the snapshot


def test_receiver_two_versions_behind_takes_full_snapshot(relays, ns, served):
    writer, reader = relays
    run = run_name(ns)
    pub = SparsePublisher(writer, run)
    served.append(pub)
    train = Training(1)
    behind = WeightReceiver(reader, run, requester="behind", full_timeout_s=20)
    pub.publish(0, train.weights())
    behind.pull(0)
    for v in (1, 2):
        train.step()
        pub.publish(v, train.weights())
    assert read_manifest(reader, run, 2).meta["kind"] == "delta"
    pub.start_server(interval_s=0.02)
    report = behind.pull(2)
    assert report.mode == "full" and "delta onto v1, but v0 held" in report.fallback
    assert behind.version == 2 and same(behind.tensors, train.weights())
    assert pub.snapshots.served and pub.snapshots.served[-1].part == "full"
    # the request is cleared right after the snapshot is in place (the pull may end first)
    deadline = time.monotonic() + 10
    while reader.exists(request_key(run, 2)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not reader.exists(request_key(run, 2))


def test_fresh_receiver_gets_full_snapshot_of_a_delta_version(tmp_path, served):
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "r")
    served.append(pub)
    train = Training(2)
    pub.publish(0, train.weights())
    train.step()
    pub.publish(1, train.weights())
    pub.start_server(interval_s=0.02)
    rx = WeightReceiver(relay, "r", full_timeout_s=20)
    assert rx.pull(1).mode == "full"
    assert same(rx.tensors, train.weights())
    # a second fresh receiver finds the snapshot already there: no new push
    pushes = len(pub.snapshots.served)
    again = WeightReceiver(relay, "r", full_timeout_s=20)
    assert again.pull(1).mode == "full" and len(pub.snapshots.served) == pushes


@pytest.mark.parametrize("pipelined", [True, False])
@pytest.mark.parametrize("damage", ["flip", "truncate", "lose"])
def test_damaged_delta_rejected_whole_then_full_snapshot_restores(relays, ns, served, damage,
                                                                  pipelined):
    writer, reader = relays
    run = run_name(ns)
    pub = SparsePublisher(writer, run, bucket_bytes=16 << 10)
    served.append(pub)
    train = Training(3)
    rx = WeightReceiver(reader, run, full_timeout_s=0.3, rerequest_s=0.05, pipelined=pipelined)
    pub.publish(0, train.weights())
    rx.pull(0)
    v0 = {n: t.clone() for n, t in rx.tensors.items()}
    train.step()
    pub.publish(1, train.weights())
    manifest = Manifest.from_json(reader.get(manifest_key(run, 1)))
    assert len(manifest.buckets) >= 2  # damage the LAST bucket: earlier ones were fine
    key = bucket_key(run, 1, len(manifest.buckets) - 1)
    blob = bytearray(reader.get(key))
    if damage == "flip":
        blob[len(blob) // 2] ^= 0x10
        writer.put(key, blob)
    elif damage == "truncate":
        writer.put(key, blob[: len(blob) // 2])
    else:
        writer.remove(key)
    # No one serves full snapshots yet: the pull fails loudly. Pipelined, buckets that arrived
    # before the damage was seen went into the held weights in place: it then holds no version
    # (the next pull is a full snapshot); else (not pipelined, or the damage seen first) it
    # still holds v0 untouched. Never a mix under a version number.
    with pytest.raises(SnapshotUnavailable, match="needed because"):
        rx.pull(1)
    if rx.version is None:
        assert pipelined and rx.digest == "" and "failed partway" in rx.broken
    else:
        assert rx.version == 0 and same(rx.tensors, v0)
    request = json.loads(reader.get(request_key(run, 1)))
    reason = {"flip": "checksum mismatch", "truncate": "expected", "lose": "incomplete"}[damage]
    assert request["version"] == 1 and reason in request["reason"]
    # Now the trainer's server answers: the receiver lands on v1, bit-exact.
    pub.start_server(interval_s=0.02)
    rx.full_timeout_s = 20
    report = rx.pull(1)
    assert report.mode == "full" and reason in report.fallback
    assert rx.version == 1 and same(rx.tensors, train.weights())


def test_base_with_other_content_is_a_mismatch_then_full(tmp_path, served):
    """Same version number, different bits (a receiver that went wrong): the result checksum
    catches it, nothing is applied, and the full snapshot repairs it."""
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "r")
    served.append(pub)
    train = Training(4)
    pub.publish(0, train.weights())
    rx = WeightReceiver(relay, "r", full_timeout_s=20)
    rx.pull(0)
    name = "model.layers.0.self_attn.q_proj.weight"
    rx.tensors[name] = rx.tensors[name].clone()
    rx.tensors[name].view(-1)[7] += 1  # one element off
    train.step()
    pub.publish(1, train.weights())
    with pytest.raises(DeltaBaseMismatch):
        pull_weights(relay, "r", 1, base=rx.tensors, base_version=0)
    pub.start_server(interval_s=0.02)
    report = rx.pull(1)
    assert report.mode == "full" and "DeltaBaseMismatch" in report.fallback
    assert same(rx.tensors, train.weights())


def test_receiver_accepts_newer_when_asked(tmp_path, served):
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "r")
    served.append(pub)
    train = Training(8)
    rx = WeightReceiver(relay, "r", full_timeout_s=20)
    pub.publish(0, train.weights())
    rx.pull(0)
    for v in (1, 2):
        train.step()
        pub.publish(v, train.weights())
    pub.start_server(interval_s=0.02)
    # v1's delta applies onto v0, and with accept_newer v2 (the newest) is fine as well
    assert rx.pull(1, accept_newer=True).version == 1
    assert rx.pull(1, accept_newer=True).mode == "noop"
    fresh = WeightReceiver(relay, "r", full_timeout_s=20)
    assert fresh.pull(1, accept_newer=True).version == 2  # the publisher serves only v2
    assert same(fresh.tensors, train.weights())


@pytest.mark.parametrize("force", ["ef", "coo", "ternary"])
def test_change_count_read_from_payload_matches_a_compare(force):
    from storage.delta import encode_delta
    from storage.weights.transfer_metrics import changed_in_payload

    g = torch.Generator().manual_seed(11)
    base = torch.randn(5000, generator=g).to(torch.bfloat16)
    new = base.clone()
    new[torch.randperm(5000, generator=g)[:123]] += 1.0  # 123 distinct positions move
    payload = encode_delta(new, base, name="w", base_version=0, target_version=1, force=force)
    assert changed_count(new, base) == 123
    assert changed_in_payload(payload) == (None if force == "ternary" else 123)
