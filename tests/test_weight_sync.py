"""Sparse weight publishing end to end: deltas after a full snapshot, applied only onto their
base, bit-exact over several versions through the filesystem and the real Mooncake relay; any
damage, loss or skew falls back to a full snapshot and never leaves a partial version."""
from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from storage.weights.buckets import Manifest
from storage.delta import DeltaBaseMismatch
from storage.relay.filesystem import FilesystemRelay
from storage.weights.sparse_publisher import SparsePublisher
from storage.weights.transfer_metrics import changed_count
from storage.weights.publisher import (bucket_key, manifest_key, pull_weights, read_manifest,
                                      request_key)
from storage.weights.receiver import SnapshotUnavailable, WeightReceiver

from mooncake_fixtures import mooncake, mooncake_pair, ns, relays, skip_without_mooncake  # noqa: F401


def bits(t: torch.Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and a[n].shape == b[n].shape and bits(a[n]) == bits(b[n])
        for n in a)


class Training:
    """fp32 masters nudged by small steps and published as bf16 (most elements keep their
    bf16 bits), plus odd members: special values, an empty tensor, an int counter."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.g = g
        self.master = {"model.embed_tokens.weight": 0.02 * torch.randn(300, 64, generator=g),
                       "model.layers.0.self_attn.q_proj.weight": 0.02 * torch.randn(64, 64, generator=g),
                       "model.layers.0.input_layernorm.weight": 1 + 0.1 * torch.randn(64, generator=g),
                       "model.layers.1.mlp.up_proj.weight": 0.02 * torch.randn(256, 64, generator=g),
                       "lm_head.bias": torch.zeros(0)}
        special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-40])
        self.extra = {"model.special": special.to(torch.bfloat16),
                      "model.steps": torch.tensor([0], dtype=torch.int64)}

    def step(self, lr: float = 3e-4) -> None:
        for t in self.master.values():
            t.add_(lr * torch.randn(t.shape, generator=self.g).sign())
        self.extra["model.steps"] = self.extra["model.steps"] + 1

    def weights(self) -> dict[str, torch.Tensor]:
        return {**{n: t.to(torch.bfloat16) for n, t in self.master.items()},
                **{n: t.clone() for n, t in self.extra.items()}}


def run_name(ns: str) -> str:
    return ns.replace("/", "-")


@pytest.fixture
def served():
    """Publishers whose request server threads are stopped at teardown."""
    publishers: list[SparsePublisher] = []
    yield publishers
    for p in publishers:
        p.stop_server()


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
    assert pub.served and pub.served[-1].part == "full"
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
    pushes = len(pub.served)
    again = WeightReceiver(relay, "r", full_timeout_s=20)
    assert again.pull(1).mode == "full" and len(pub.served) == pushes


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


def test_damaged_full_snapshot_is_pushed_again(tmp_path, served):
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "r")
    served.append(pub)
    train = Training(5)
    pub.publish(0, train.weights())
    train.step()
    pub.publish(1, train.weights())
    relay.put(request_key("r", 1), json.dumps({"by": "t"}).encode())
    assert pub.serve_requests().part == "full"
    key = bucket_key("r", 1, 0, part="full")
    blob = bytearray(relay.get(key))
    blob[100] ^= 1
    relay.put(key, blob)
    pub.start_server(interval_s=0.02)
    rx = WeightReceiver(relay, "r", full_timeout_s=20, rerequest_s=0.05)
    report = rx.pull(1)
    assert report.mode == "full" and "full snapshot unusable" in report.fallback
    assert same(rx.tensors, train.weights()) and len(pub.served) == 2


def test_publisher_republishes_a_version_the_relay_lost(tmp_path):
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "r")
    train = Training(6)
    pub.publish(0, train.weights())
    train.step()
    pub.publish(1, train.weights())
    assert pub.serve_requests() is None  # nothing lost, nothing asked
    relay.remove_prefix("rose/r/")  # what a master restart does to every object
    report = pub.serve_requests()
    assert report.kind == "full" and report.part == "" and "lost" in report.reason
    rx = WeightReceiver(relay, "r", full_timeout_s=1)
    assert rx.pull().mode == "full" and rx.version == 1
    assert same(rx.tensors, train.weights())


def test_republish_of_same_version_or_a_gap_goes_full(tmp_path):
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "r")
    train = Training(7)
    assert pub.publish(0, train.weights()).reason == "first snapshot"
    assert pub.publish(0, train.weights()).kind == "full"  # a retried publish
    train.step()
    assert pub.publish(2, train.weights()).kind == "full"  # a skipped version
    assert "does not follow" in read_manifest(relay, "r", 2).meta["reason"]
    train.step()
    renamed = {("x." + n if n == "lm_head.bias" else n): t for n, t in train.weights().items()}
    assert pub.publish(3, renamed).kind == "full"
    assert SparsePublisher(relay, "r", sparse=False).publish(4, renamed).kind == "full"


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


@pytest.mark.slow
def test_mooncake_master_restart_republishes_full_snapshot(tmp_path):
    """A restarted master has lost every object: the trainer's server republishes the version
    it holds, a receiver behind by one pulls it in full, bit-exact."""
    skip_without_mooncake()
    from rose.stack.mooncake import start_mooncake
    from rose.stack.ports import LOCALHOST
    from storage.relay.mooncake import MooncakeRelay

    services = start_mooncake(tmp_path / "mc")
    try:
        writer = MooncakeRelay(services.master_addr, services.metadata_url,
                               segment_bytes=64 << 20, local_buffer_bytes=16 << 20)
        reader = MooncakeRelay(services.master_addr, services.metadata_url, segment_bytes=0,
                               local_buffer_bytes=16 << 20)
        pub = SparsePublisher(writer, "mc")
        train = Training(9)
        rx = WeightReceiver(reader, "mc", full_timeout_s=60, rerequest_s=0.5)
        pub.publish(0, train.weights())
        rx.pull(0)
        train.step()
        pub.publish(1, train.weights())
        master = services.processes[-1]
        master.stop(grace=3)
        master.start()
        master.wait_for_port(LOCALHOST, int(services.master_addr.rsplit(":", 1)[1]))
        pub.start_server(interval_s=0.1)
        done = threading.Event()
        result = {}

        def pull() -> None:
            try:
                result["report"] = rx.pull(1)
            except Exception as e:  # surfaced below
                result["error"] = e
            done.set()

        threading.Thread(target=pull, daemon=True).start()
        assert done.wait(90), "receiver did not finish within 90 s after the master restart"
        pub.stop_server()
        assert "error" not in result, result.get("error")
        assert result["report"].version == 1 and result["report"].mode == "full"
        assert same(rx.tensors, train.weights())
        assert any("lost" in r.reason for r in pub.served)
        reader.close()
        writer.close()
    finally:
        services.stop()


def test_version_republished_with_other_bits_is_pulled_again(tmp_path):
    """A trainer that came back with other bits under the same version number (e.g. resumed
    from an older checkpoint) republishes in full; a receiver holding the old bits must not
    keep them just because the number matches."""
    from executors.workers.rollout_worker import weights_digest
    from storage.weights.sparse_publisher import tensors_digest

    relay = FilesystemRelay(tmp_path)
    train = Training(10)
    SparsePublisher(relay, "r").publish(3, train.weights())
    rx = WeightReceiver(relay, "r", full_timeout_s=1)
    rx.pull(3)
    assert rx.pull(3).mode == "noop"
    train.step()
    restarted = SparsePublisher(relay, "r")  # a new trainer process: no base held
    report = restarted.publish(3, train.weights())
    assert report.kind == "full" and report.digest == tensors_digest(train.weights())
    nonempty = {n: t for n, t in train.weights().items() if t.numel()}
    assert tensors_digest(nonempty) == weights_digest(nonempty)  # the spine's digest
    got = rx.pull(3)
    assert got.mode == "full" and "other bits" in got.fallback
    assert same(rx.tensors, train.weights()) and rx.digest == report.digest


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


def test_server_pushes_a_snapshot_again_only_when_that_one_is_reported_damaged(tmp_path):
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "r")
    train = Training(12)
    pub.publish(0, train.weights())
    train.step()
    pub.publish(1, train.weights())

    def ask(**body) -> None:
        relay.put(request_key("r", 1), json.dumps({"by": "t", **body}).encode())

    ask()
    first = pub.serve_requests()
    assert first.part == "full" and not relay.exists(request_key("r", 1))
    stamp = read_manifest(relay, "r", 1, "full").meta["published_at"]
    ask()  # a late plain request: the snapshot is there, nothing is pushed
    assert pub.serve_requests() is None and not relay.exists(request_key("r", 1))
    ask(damaged=[stamp - 1.0])  # damage reported on an older snapshot: this one stays
    assert pub.serve_requests() is None
    ask(damaged=[stamp])
    assert pub.serve_requests().part == "full"
    assert read_manifest(relay, "r", 1, "full").meta["published_at"] != stamp
    assert len(pub.served) == 2
