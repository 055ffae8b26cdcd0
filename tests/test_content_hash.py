"""The content hash (storage/delta/content_hash.py): one value for a tensor whoever computes it
(a delta's result checksum, a raw bucket entry's checksum, the digest's tensor hash), and a
large tensor's bits are hashed once by the publisher that codes it in blocks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import xxhash

import storage.delta.content_hash as ch
from storage.delta import DeltaBaseMismatch, apply_delta, blocks, encode_delta, read_header
from storage.weights.buckets import pack, verify_bucket, CorruptBucket
from storage.weights.digest import raw_entry_hashes, tensor_hash, tensors_digest
from storage.weights.payloads import raw_encoder
from weight_fixtures import count_hashed


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 KB from 128 KB up: a test-sized tensor takes the large tensors' path."""
    monkeypatch.setattr(blocks, "SPLIT_BYTES", 128 << 10)
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 64 << 10)


def _pair(rows: int = 1000, cols: int = 256, density: float = 0.05):
    gen = torch.Generator().manual_seed(0)
    old = (0.02 * torch.randn(rows, cols, generator=gen)).to(torch.bfloat16)
    moved = torch.rand(rows, cols, generator=gen) < density
    return old, torch.where(moved, (old.float() * 1.01 + 1e-4).to(torch.bfloat16), old)


def test_small_buffers_hash_as_xxh3_of_their_bytes_in_any_form():
    u = np.arange(1000, dtype=np.uint16).reshape(10, 100)
    want = xxhash.xxh3_64_intdigest(u.tobytes())
    assert ch.content_hash(u) == ch.content_hash(u.tobytes()) == want
    assert ch.content_hash(memoryview(u.tobytes())) == want
    assert ch.content_hash(b"") == xxhash.xxh3_64_intdigest(b"")


def test_a_large_buffer_hashes_over_blocks_and_any_bit_shows(small_blocks):
    data = np.random.default_rng(1).integers(0, 255, 300 << 10, dtype=np.uint8)
    assert blocks.splits(data.nbytes)
    h = ch.content_hash(data)
    assert h != xxhash.xxh3_64_intdigest(data)  # not the plain hash: the blocked one
    for at in (0, (64 << 10) - 1, 64 << 10, data.nbytes - 1):  # each block, its edges
        flipped = data.copy()
        flipped[at] ^= 1
        assert ch.content_hash(flipped) != h
    # the same bytes seen as bf16 bits hash the same (the digest and the codec agree)
    assert ch.content_hash(data.view(np.uint16)) == h


def test_a_blocked_delta_carries_the_tensors_hash_and_applies(small_blocks):
    old, new = _pair()
    payload = encode_delta(new, old, name="w", base_version=3, target_version=4)
    head = read_header(payload)
    assert head.encoding == "blocks" and head.result_checksum == tensor_hash(new)
    forced = encode_delta(new, old, name="w", base_version=3, target_version=4, force="ef")
    assert read_header(forced).result_checksum == tensor_hash(new)  # unsplit, same hash
    held = old.clone()
    apply_delta(forced, held, base_version=3, in_place=True)  # verified by the blocked hash
    assert torch.equal(held.view(torch.int16), new.view(torch.int16))
    other = old.clone()
    other.view(torch.int16)[-1, -1] ^= 1  # the last block's base differs from the sender's
    with pytest.raises(DeltaBaseMismatch):
        apply_delta(forced, other, base_version=3)
    # the receiver's digest from the verified checksum is the digest of the tensors
    assert tensors_digest({"w": new}, {"w": head.result_checksum}) == tensors_digest({"w": new})


def test_the_publisher_hashes_a_blocked_tensors_bits_once(small_blocks, monkeypatch):
    """It used to hash the whole tensor besides each block: twice its bits per publish."""
    hashed = count_hashed(monkeypatch)
    old, new = _pair(rows=2000)
    encode_delta(new, old, name="w", base_version=3, target_version=4)
    blocks_n = len(blocks.ranges(new.numel(), 2))
    assert sum(hashed) == new.numel() * 2 + 8 * blocks_n  # every bit once, then the block hashes


def test_a_large_raw_entrys_checksum_is_its_tensors_hash(small_blocks):
    old, new = _pair(rows=600)
    small = torch.ones(7, dtype=torch.bfloat16)
    items = [(n, *raw_encoder(n, t)) for n, t in (("big", new), ("small", small))]
    manifest, views = pack(items, bucket_bytes=64 << 10)
    assert raw_entry_hashes(manifest.buckets) == {"big": tensor_hash(new),
                                                  "small": tensor_hash(small)}
    info = manifest.buckets[0]
    bad = bytearray(views[0])
    bad[info.entries[0].offset + 5] ^= 1
    with pytest.raises(CorruptBucket, match="entry 'big' checksum mismatch"):
        verify_bucket(info, bad)


@pytest.mark.parametrize("split, block", [(128 << 10, (16 << 10) + 1), (16 << 10, 64 << 10)])
def test_block_sizes_that_do_not_compose_still_give_the_tensors_hash(monkeypatch, split, block):
    """Odd blocks (not a whole number of bf16s) or blocks as large as the split: the block
    checksums do not make the content hash, which is then taken from the bits."""
    monkeypatch.setattr(blocks, "SPLIT_BYTES", split)
    monkeypatch.setattr(blocks, "BLOCK_BYTES", block)
    assert not ch.composes(2)
    old, new = _pair()
    payload = encode_delta(new, old, name="w", base_version=3, target_version=4)
    assert read_header(payload).encoding == "blocks"
    assert read_header(payload).result_checksum == tensor_hash(new)
    held = old.clone()
    apply_delta(payload, held, base_version=3, in_place=True)
    assert torch.equal(held.view(torch.int16), new.view(torch.int16))
