"""A version's manifest and its first buckets in one relay round trip
(storage/weights/first_read.py), on a real Mooncake master and two clients."""
from __future__ import annotations

import pytest

from mooncake_fixtures import mooncake, mooncake_pair, ns  # noqa: F401 (fixtures)
from storage.relay.filesystem import FilesystemRelay
from storage.weights import first_read
from storage.weights.first_read import Layout, read_first
from storage.weights.versions import read_manifest
from storage.weights.receiver import WeightReceiver
from storage.weights.digest import tensors_digest
from storage.weights.sparse_publisher import SparsePublisher
from weight_fixtures import Training, run_name, same


def _reads(relay, monkeypatch) -> list[str]:
    """The names of the relay's reads, in order, as the receiver makes them."""
    calls: list[str] = []
    for name in ("get", "get_many", "get_batch"):
        real = getattr(relay, name)
        monkeypatch.setattr(relay, name, lambda *args, _real=real, _name=name:
                            (calls.append(_name), _real(*args))[1])
    return calls


def _two_versions(pair, ns, bucket_bytes: int = 64 << 20, v1_bucket_bytes: int | None = None):
    """v0 pulled by a receiver; v1 (a delta all sent raw: not streamed) published whole."""
    writer, reader = pair
    run = run_name(ns)
    pub = SparsePublisher(writer, run, bucket_bytes, link_gbps=100.0)  # tiny: all raw at 100
    train = Training(7)
    pub.publish(0, train.weights())
    rx = WeightReceiver(reader, run, full_timeout_s=5)
    assert rx.pull(0).mode == "full"
    train.step(3e-2)
    v1 = train.weights()
    pub.bucket_bytes = v1_bucket_bytes or bucket_bytes
    report = pub.publish(1, v1)
    assert all(t.encoding == "raw" for t in report.tensors)
    return run, rx, v1


def test_a_small_version_is_read_in_one_round_trip(mooncake_pair, ns, monkeypatch):
    run, rx, v1 = _two_versions(mooncake_pair, ns)
    reads = _reads(mooncake_pair[1], monkeypatch)
    report = rx.pull(1)
    assert report.mode == "delta" and report.rejected == 0
    assert same(rx.tensors, v1) and rx.digest == tensors_digest(v1)
    assert reads == ["get_batch"]  # manifest and bucket together, nothing read again


def test_a_guessed_bucket_that_fails_its_checksum_is_fetched_again(mooncake_pair, ns,
                                                                   monkeypatch):
    run, rx, v1 = _two_versions(mooncake_pair, ns)
    reader = mooncake_pair[1]
    real = reader.get_batch

    def torn(keys, limits):
        values = real(keys, limits)
        values[1][len(values[1]) // 2] ^= 0xFF  # a writable copy: the relay's is intact
        return values
    monkeypatch.setattr(reader, "get_batch", torn)
    report = rx.pull(1)
    assert report.rejected == 1 and report.mode == "delta"
    assert same(rx.tensors, v1) and rx.digest == tensors_digest(v1)


def test_a_garbled_manifest_in_the_batch_is_read_again(mooncake_pair, ns, monkeypatch):
    run, rx, v1 = _two_versions(mooncake_pair, ns)
    reader = mooncake_pair[1]
    real = reader.get_batch
    monkeypatch.setattr(reader, "get_batch",
                        lambda keys, limits: [memoryview(bytearray(b"{not json"))]
                        + real(keys, limits)[1:])
    reads = _reads(reader, monkeypatch)
    assert rx.pull(1).mode == "delta"
    assert same(rx.tensors, v1)
    assert reads == ["get_batch", "get"]  # the manifest again; the bucket read with it is used


@pytest.mark.parametrize("before, after", [(4 << 10, 64 << 20), (64 << 20, 4 << 10)])
def test_a_guess_of_more_or_fewer_buckets_than_published(mooncake_pair, ns, monkeypatch,
                                                        before, after):
    """v0 in many buckets and v1 in one, or the reverse: the buckets guessed that do not
    exist read as absent, the ones not guessed are fetched as usual."""
    run, rx, v1 = _two_versions(mooncake_pair, ns, before, after)
    buckets = len(read_manifest(mooncake_pair[1], run, 1).buckets)
    assert (buckets > 1) == (after < before)
    reads = _reads(mooncake_pair[1], monkeypatch)
    assert rx.pull(1).mode == "delta"
    assert same(rx.tensors, v1) and rx.digest == tensors_digest(v1)
    assert reads == ["get_batch"] + ["get_many"] * (buckets - 1)


def test_a_bucket_larger_than_guessed_is_fetched_on_its_own(mooncake_pair, ns, monkeypatch):
    run, rx, v1 = _two_versions(mooncake_pair, ns)
    monkeypatch.setattr(first_read.Layout, "limits",
                        lambda self: [64 << 10] + [64] * len(self.buckets))  # no bucket fits
    reads = _reads(mooncake_pair[1], monkeypatch)
    report = rx.pull(1)
    assert report.mode == "delta" and report.rejected == 0 and same(rx.tensors, v1)
    assert reads == ["get_batch", "get_many"]  # the manifest came with the batch


def test_batched_reads_give_each_value_or_none(mooncake_pair, ns):
    writer, reader = mooncake_pair
    small, large = bytes(range(256)) * 3 + b"x", bytes(range(256)) * 4096
    writer.put(f"{ns}/small", small)
    writer.put(f"{ns}/large", large)
    keys = [f"{ns}/small", f"{ns}/absent", f"{ns}/large", f"{ns}/large"]
    values = reader.get_batch(keys, [4096, 4096, len(large), len(large) - 1])
    assert bytes(values[0]) == small and bytes(values[2]) == large
    assert values[1] is None and values[3] is None  # absent; larger than its limit
    values[2][0] ^= 0xFF  # the caller's own copy, aligned as an allocation of its own
    assert reader.get(f"{ns}/large") == large
    assert all(__import__("numpy").frombuffer(v, "u1").ctypes.data % 64 == 0
               for v in values if v is not None)
    with pytest.raises(ValueError, match="one limit > 0 per key"):
        reader.get_batch(keys, [4096])
    with pytest.raises(ValueError, match="relay key"):
        reader.get_batch([f"{ns}/../small"], [4096])


def test_no_guess_where_the_version_held_was_large(mooncake_pair, ns, monkeypatch):
    run, rx, v1 = _two_versions(mooncake_pair, ns)
    monkeypatch.setattr(first_read, "GUESS_BYTES", 1)
    reads = _reads(mooncake_pair[1], monkeypatch)
    assert rx.pull(1).mode == "delta" and same(rx.tensors, v1)
    assert reads == ["get", "get_many"]


def test_a_relay_without_batched_reads_reads_the_manifest_alone(tmp_path):
    relay = FilesystemRelay(tmp_path)
    pub = SparsePublisher(relay, "fs", link_gbps=100.0)
    train = Training(3)
    pub.publish(0, train.weights())
    for guess in (Layout((1 << 10,), 1), Layout((), 0)):  # a version held with no buckets too
        manifest, read = read_first(relay, "fs", 0, guess)
        assert manifest.version == 0 and read == {}
    with pytest.raises(Exception, match="v1 of run 'fs' are not in"):  # as read_manifest says
        read_first(relay, "fs", 1, Layout((1 << 10,), 1))
