"""The publisher's side of keeping receivers whole: a version the relay lost (a Mooncake master
restart, real in one test) is pushed again in full; a retried or skipped version goes full; a
version republished with other bits is pulled again; a full snapshot is pushed again only when
the one in the relay is reported damaged."""
from __future__ import annotations

import json
import threading

import pytest

from storage.relay.filesystem import FilesystemRelay
from storage.weights.sparse_publisher import SparsePublisher
from storage.weights.versions import bucket_key, read_manifest, request_key
from storage.weights.receiver import WeightReceiver

from mooncake_fixtures import mooncake, mooncake_pair, mooncake_shared_pair, ns, relays, skip_without_mooncake  # noqa: F401
from weight_fixtures import Training, bits, run_name, same, served  # noqa: F401


def test_damaged_full_snapshot_is_pushed_again(tmp_path, served):
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "r")
    served.append(pub)
    train = Training(5)
    pub.publish(0, train.weights())
    train.step()
    pub.publish(1, train.weights())
    relay.put(request_key("r", 1), json.dumps({"by": "t"}).encode())
    assert pub.snapshots.serve_requests().part == "full"
    key = bucket_key("r", 1, 0, part="full")
    blob = bytearray(relay.get(key))
    blob[100] ^= 1
    relay.put(key, blob)
    pub.start_server(interval_s=0.02)
    rx = WeightReceiver(relay, "r", full_timeout_s=20, rerequest_s=0.05)
    report = rx.pull(1)
    assert report.mode == "full" and "full snapshot unusable" in report.fallback
    assert same(rx.tensors, train.weights()) and len(pub.snapshots.served) == 2


def test_publisher_republishes_a_version_the_relay_lost(tmp_path):
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "r")
    train = Training(6)
    pub.publish(0, train.weights())
    train.step()
    pub.publish(1, train.weights())
    assert pub.snapshots.serve_requests() is None  # nothing lost, nothing asked
    relay.remove_prefix("rose/r/")  # what a master restart does to every object
    report = pub.snapshots.serve_requests()
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


@pytest.mark.slow
@pytest.mark.parametrize("shared", [False, True], ids=["own-segments", "store-client"])
def test_mooncake_master_restart_republishes_full_snapshot(tmp_path, shared):
    """A restarted master has lost every object: the trainer's server republishes the version
    it holds, a receiver behind by one pulls it in full, bit-exact; with segments of their
    own, and as `rose up` opens them (one client of the stack's store client per process,
    whose first reads after the restart answer -900 while it reconnects: waited out)."""
    skip_without_mooncake()
    from rose.stack.mooncake import start_mooncake
    from rose.stack.ports import LOCALHOST
    from storage.relay.mooncake import MooncakeRelay

    services = start_mooncake(tmp_path / "mc", store_mb=256 if shared else 0)
    try:
        client = services.client_addr if shared else None
        writer = MooncakeRelay(services.master_addr, services.metadata_url,
                               segment_bytes=0 if shared else 64 << 20,
                               local_buffer_bytes=16 << 20, client_addr=client)
        reader = writer if shared else MooncakeRelay(
            services.master_addr, services.metadata_url, segment_bytes=0,
            local_buffer_bytes=16 << 20)
        pub = SparsePublisher(writer, "mc")
        train = Training(9)
        rx = WeightReceiver(reader, "mc", full_timeout_s=60, rerequest_s=0.5)
        pub.publish(0, train.weights())
        rx.pull(0)
        train.step()
        pub.publish(1, train.weights())
        master = next(p for p in services.processes if p.name == "mooncake-master")
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
        assert any("lost" in r.reason for r in pub.snapshots.served)
        writer.close()
        reader.close()
    finally:
        services.stop()


def test_version_republished_with_other_bits_is_pulled_again(tmp_path):
    """A trainer that came back with other bits under the same version number (e.g. resumed
    from an older checkpoint) republishes in full; a receiver holding the old bits must not
    keep them just because the number matches."""
    from storage.weights.digest import tensors_digest

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
    got = rx.pull(3)
    assert got.mode == "full" and "other bits" in got.fallback
    assert same(rx.tensors, train.weights()) and rx.digest == report.digest


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
    first = pub.snapshots.serve_requests()
    assert first.part == "full" and not relay.exists(request_key("r", 1))
    stamp = read_manifest(relay, "r", 1, "full").meta["published_at"]
    ask()  # a late plain request: the snapshot is there, nothing is pushed
    assert pub.snapshots.serve_requests() is None and not relay.exists(request_key("r", 1))
    ask(damaged=[stamp - 1.0])  # damage reported on an older snapshot: this one stays
    assert pub.snapshots.serve_requests() is None
    ask(damaged=[stamp])
    assert pub.snapshots.serve_requests().part == "full"
    assert read_manifest(relay, "r", 1, "full").meta["published_at"] != stamp
    assert len(pub.snapshots.served) == 2
