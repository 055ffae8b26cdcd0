"""Buckets: packing layout, bit-exact round trips, corrupted/truncated buckets rejected."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
import xxhash

from storage.weights.buckets import (ALIGN, CorruptBucket, CorruptManifest, Manifest, pack,
                                     pack_buckets, unpack,
                             verify_bucket)
from storage.weights.payloads import _decode_raw, raw_encoder
from weight_fixtures import count_hashed


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def payloads(sizes):
    return [(f"p{i}", os.urandom(n), {"i": i}) for i, n in enumerate(sizes)]


def test_packing_layout_by_hand():
    # bucket 256: 100 -> [0,100), next at 128: 100 -> [128,228); 50 would end at 306 > 256
    manifest, blobs = pack(payloads([100, 100, 50, 1000, 10]), bucket_bytes=256, version=7)
    layout = [[(e.name, e.offset, e.length) for e in b.entries] for b in manifest.buckets]
    assert layout == [[("p0", 0, 100), ("p1", 128, 100)],
                      [("p2", 0, 50)],
                      [("p3", 0, 1000)],    # larger than a bucket: a bucket of its own
                      [("p4", 0, 10)]]
    assert [len(b) for b in blobs] == [256, 64, 1024, 64]  # rounded up to ALIGN
    assert [b.nbytes for b in manifest.buckets] == [256, 64, 1024, 64]
    assert manifest.version == 7 and manifest.nbytes == 256 + 64 + 1024 + 64
    assert all(e.offset % ALIGN == 0 for _, e in manifest.entries())


def test_checksums_are_xxh3_of_the_entries_and_of_their_checksums():
    items = payloads([300, 5])
    manifest, blobs = pack(items, bucket_bytes=1 << 20)
    (bucket,) = manifest.buckets
    assert [e.checksum for e in bucket.entries] == [xxhash.xxh3_64(p).hexdigest()
                                                    for _, p, _ in items]
    sums = b"".join(int(e.checksum, 16).to_bytes(8, "little") for e in bucket.entries)
    assert bucket.checksum == xxhash.xxh3_64(sums).hexdigest()


def test_packing_hashes_each_byte_once(monkeypatch):
    """It used to hash every entry and then the whole bucket again."""
    hashed = count_hashed(monkeypatch)
    items = payloads([3000, 500, 70000])
    manifest, _ = pack(items, bucket_bytes=1 << 20)
    entries = len(items)
    assert sum(hashed) == sum(len(p) for _, p, _ in items) + 8 * entries  # + the checksums


def test_a_bucket_checksum_that_its_entries_do_not_make_is_refused():
    manifest, blobs = pack(payloads([100, 100]), bucket_bytes=512)
    info = dataclasses.replace(manifest.buckets[0], checksum="0" * 16)
    verify_bucket(manifest.buckets[0], blobs[0])  # as packed: fine
    with pytest.raises(CorruptBucket, match="entries' checksums do not make the bucket's"):
        verify_bucket(info, blobs[0])


def test_empty_payload_never_opens_a_bucket():
    manifest, _ = pack(payloads([200, 0, 10]), bucket_bytes=256)
    layout = [[(e.name, e.offset, e.length) for e in b.entries] for b in manifest.buckets]
    assert layout == [[("p0", 0, 200), ("p1", 256, 0)], [("p2", 0, 10)]]
    assert manifest.buckets[0].nbytes == 256


def test_round_trip_bytes_and_metadata():
    items = payloads([0, 1, 63, 64, 65, 4096, 10_000])
    manifest, blobs = pack(items, bucket_bytes=4096)
    back = Manifest.from_json(manifest.to_json())
    out = unpack(back, blobs)
    assert list(out) == [name for name, _, _ in items]
    for name, data, meta in items:
        view, got_meta = out[name]
        assert bytes(view) == data and got_meta == meta


def test_bf16_tensors_round_trip_bit_exact():
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**15, 2**15, (1000,), generator=g, dtype=torch.int16)
    special = torch.tensor([0x7FC0, 0x7F80, -0x0080, -0x8000, 0x0001, 0x7F81], dtype=torch.int16)
    tensors = {
        "w": torch.randn(33, 17, generator=g).to(torch.bfloat16),
        "bits": torch.cat([bits, special]).view(torch.bfloat16),  # NaN, +-Inf, -0, subnormal
        "scalar": torch.tensor(1.5, dtype=torch.bfloat16),
        "empty": torch.empty(0, 4, dtype=torch.bfloat16),
        "f32": torch.randn(5, generator=g),
        "mask": torch.tensor([True, False, True]),
    }
    manifest, blobs = pack([(n, *raw_encoder(n, t)) for n, t in tensors.items()], 1024)
    out = unpack(Manifest.from_json(manifest.to_json()), [bytearray(b) for b in blobs])
    for name, t in tensors.items():
        got = _decode_raw(*out[name], None, None)
        assert got.dtype == t.dtype and got.shape == t.shape
        assert raw_bytes(got) == raw_bytes(t), name


def test_flipped_bit_names_bucket_and_entry():
    manifest, blobs = pack(payloads([100, 100, 100]), bucket_bytes=512)
    blobs = [bytearray(b) for b in blobs]
    blobs[0][128 + 7] ^= 0x10  # inside p1
    with pytest.raises(CorruptBucket, match=r"^bucket 0: entry 'p1' checksum mismatch$"):
        unpack(manifest, blobs)
    with pytest.raises(CorruptBucket, match=r"^rose/r/v1/bucket-0: entry 'p1'"):
        verify_bucket(manifest.buckets[0], blobs[0], "rose/r/v1/bucket-0")


def test_truncated_bucket_names_cut_entry_and_returns_nothing():
    manifest, blobs = pack(payloads([100, 100, 100, 100]), bucket_bytes=256)
    assert len(blobs) == 2
    short = bytes(blobs[1])[:150]  # p3 spans [128, 228) of bucket 1
    with pytest.raises(CorruptBucket, match=r"^bucket 1: 150 bytes, expected 256, entry 'p3'"):
        unpack(manifest, [blobs[0], short])
    with pytest.raises(CorruptBucket, match="1 buckets given, manifest lists 2"):
        unpack(manifest, [blobs[0]])


def test_corrupt_padding_is_still_caught():
    manifest, blobs = pack(payloads([10, 10]), bucket_bytes=1024)
    blob = bytearray(blobs[0])
    blob[20] = 1  # between p0 [0,10) and p1 at 64
    with pytest.raises(CorruptBucket, match="padding"):
        verify_bucket(manifest.buckets[0], blob)
    tail = bytearray(blobs[0])
    tail[-1] = 1  # after the last entry, up to the bucket's aligned end
    with pytest.raises(CorruptBucket, match="padding"):
        verify_bucket(manifest.buckets[0], tail)


def test_manifest_tampering_is_detected():
    manifest, _ = pack(payloads([10]), bucket_bytes=1024, version=3)
    doc = json.loads(manifest.to_json())
    doc["body"] = doc["body"].replace('"version":3', '"version":4')
    with pytest.raises(CorruptManifest, match="checksum"):
        Manifest.from_json(json.dumps(doc).encode())
    with pytest.raises(CorruptManifest, match="unreadable"):
        Manifest.from_json(b"{not json")
    with pytest.raises(CorruptManifest, match="unreadable"):
        Manifest.from_json(manifest.to_json()[:-5])


def test_bad_input_rejected():
    with pytest.raises(ValueError, match="appears twice"):
        pack([("a", b"1", {}), ("a", b"2", {})])
    with pytest.raises(ValueError, match="not JSON-serializable"):
        pack([("a", b"1", {"x": object()})])
    with pytest.raises(ValueError, match="bucket_bytes"):
        pack([("a", b"1", {})], bucket_bytes=8)


def test_bucket_info_as_dict_is_asdict_and_round_trips():
    import dataclasses

    from storage.weights.buckets import BucketInfo
    manifest, _ = pack([("a", b"x" * 100, {"encoding": "raw", "shape": [100]}),
                        ("b", b"", {"encoding": "raw"}), ("c", b"yz" * 70, {})], bucket_bytes=128)
    for info in manifest.buckets:
        as_json = lambda d: json.dumps(d, sort_keys=True)  # noqa: E731 (asdict keeps tuples)
        assert as_json(info.as_dict()) == as_json(dataclasses.asdict(info))
        assert BucketInfo.from_dict(json.loads(json.dumps(info.as_dict()))) == info
    assert Manifest.from_json(manifest.to_json()).buckets == manifest.buckets


def test_buckets_close_by_the_work_they_carry():
    """`work`: a bucket also closes once its payloads cost the receiver bucket_bytes (a sparse
    delta's small payloads that each rewrite a large tensor)."""
    items = [(f"t{i}", b"p" * 10, {"dense": 200}) for i in range(6)]
    by_bytes, _ = pack(items, bucket_bytes=512)  # 6 aligned payloads: 384 bytes
    assert len(by_bytes.buckets) == 1
    infos = [info for info, _ in pack_buckets(items, 512, work=[m["dense"] for *_, m in items])]
    assert [len(b.entries) for b in infos] == [2, 2, 2]


def test_a_bucket_full_of_work_goes_before_the_next_payload_is_encoded():
    """The next payload's work is known before it is encoded: the bucket it would overflow is
    yielded as soon as its own last payload is packed (a large tensor coded next, for a
    long while, does not hold back the bucket before it)."""
    encoded: list[str] = []

    def items():
        for i in range(4):
            encoded.append(f"t{i}")
            yield f"t{i}", b"p" * 10, {}
    buckets = []
    for info, _ in pack_buckets(items(), 512, work=[200, 200, 500, 100]):
        buckets.append([e.name for e in info.entries])
        assert encoded[-1] == buckets[-1][-1]  # nothing after this bucket was encoded yet
    assert buckets == [["t0", "t1"], ["t2"], ["t3"]]
    with pytest.raises(ValueError, match="costs of 3 payloads; 't3' is one more"):
        list(pack_buckets(items(), 512, work=[1, 1, 1]))
