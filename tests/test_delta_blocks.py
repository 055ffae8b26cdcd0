"""A large tensor's delta in blocks (storage/delta/blocks.py): coded and applied block by block
on the block threads, bit-exact, every block checked, the table checked, sizes as unsplit."""
from __future__ import annotations

import pytest
import torch
import xxhash

from storage.delta import CorruptPayload, DeltaBaseMismatch, apply_delta, blocks, coded_as
from storage.delta import encode_delta, read_header
from storage.delta.header import DeltaHeader
from storage.weights.parallel import ordered_map
from storage.weights.transfer_metrics import changed_count, changed_in_payload


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 KB from 128 KB up: a test-sized tensor takes the large tensors' path."""
    monkeypatch.setattr(blocks, "SPLIT_BYTES", 128 << 10)
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 64 << 10)


def _pair(rows: int = 1000, cols: int = 256, density: float = 0.05, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    old = (0.02 * torch.randn(rows, cols, generator=gen)).to(torch.bfloat16)
    moved = torch.rand(rows, cols, generator=gen) < density
    new = torch.where(moved, (old.float() * 1.01 + 1e-4).to(torch.bfloat16), old)
    return old, new


def _delta(old, new, name="w"):
    return encode_delta(new, old, name=name, base_version=3, target_version=4)


def test_large_delta_goes_in_blocks_and_applies_bit_exact(small_blocks):
    old, new = _pair()
    payload = _delta(old, new)
    head = read_header(payload)
    assert head.encoding == "blocks" and head.shape == (1000, 256)
    assert coded_as(payload) == "ef"  # 5% moved: every block is Elias-Fano
    spans = blocks.unpack(memoryview(payload)[head.header_length:], head.numel)
    assert len(spans) == -(-1000 * 256 * 2 // (64 << 10)) and spans[-1][1] == 1000 * 256
    kept = old.clone()
    aside = apply_delta(payload, old, base_version=3)
    assert torch.equal(aside.view(torch.int16), new.view(torch.int16))
    assert torch.equal(old.view(torch.int16), kept.view(torch.int16))  # base untouched
    held = old.clone()
    assert apply_delta(payload, held, base_version=3, in_place=True) is held
    assert torch.equal(held.view(torch.int16), new.view(torch.int16))
    # the digest's hash of the whole tensor, as an unsplit payload states it
    assert head.result_checksum == read_header(encode_delta(
        new, old, name="w", base_version=3, target_version=4, force="ef")).result_checksum


def test_blocks_cost_little_over_one_payload_and_are_deterministic(small_blocks):
    old, new = _pair(rows=2048, density=0.2)
    payload = _delta(old, new)
    whole = min(len(encode_delta(new, old, name="w", base_version=3, target_version=4,
                                 force=f)) for f in ("ef", "ternary"))
    # a header, a table entry and a frame's overhead per block: under 1 KB each (0.01% of an
    # 8 MB block; the 0.5B embedding's blocks come to +0.4% at lr 1e-6)
    assert len(payload) - whole < 1024 * len(blocks.ranges(2048 * 256, 2))
    assert _delta(old, new) == payload  # the block threads' timing does not show in the bytes


def test_every_block_is_checked(small_blocks):
    old, new = _pair()
    payload = bytearray(_delta(old, new))
    payload[len(payload) // 2] ^= 0x10
    with pytest.raises(CorruptPayload, match="body checksum"):
        apply_delta(bytes(payload), old, base_version=3)
    other = old.clone()
    other[999, 0] += 1  # the last block's base differs from the sender's
    with pytest.raises(DeltaBaseMismatch, match=r"block \[\d+, 256000\)"):
        apply_delta(_delta(old, new), other, base_version=3)


def test_a_table_that_does_not_cover_the_tensor_is_refused(small_blocks):
    old, new = _pair()
    head = read_header(_delta(old, new))
    subs = [_delta(old.reshape(-1)[s:e], new.reshape(-1)[s:e])
            for s, e in blocks.ranges(head.numel, 2)]
    for starts, why in (([0] * len(subs), "in order"),
                        ([s for s, _ in blocks.ranges(head.numel, 2)][1:] + [head.numel],
                         "in order")):
        body = blocks.pack(starts, subs)
        forged = DeltaHeader(name="w", encoding="blocks", dtype=new.dtype, shape=head.shape,
                             numel=head.numel, base_version=3, target_version=4,
                             result_checksum=head.result_checksum,
                             body_checksum=xxhash.xxh3_64_intdigest(body),
                             body_length=len(body)).pack() + body
        with pytest.raises(CorruptPayload, match=why):
            apply_delta(forged, old, base_version=3)


def test_change_count_is_summed_over_blocks(small_blocks):
    old, new = _pair(density=0.03)
    assert changed_in_payload(_delta(old, new)) == changed_count(new, old) > 0


def test_blocks_coded_from_inside_the_tensor_pool(small_blocks):
    """The publisher codes tensors on its pool; their blocks go to threads of their own, so a
    pool full of large tensors waiting on their blocks still finishes."""
    pairs = [_pair(seed=s) for s in range(6)]
    out = list(ordered_map(lambda p: _delta(*p), pairs, workers=2, cost=lambda _: 1 << 30))
    for (old, new), payload in zip(pairs, out):
        assert read_header(payload).encoding == "blocks"
        got = apply_delta(payload, old, base_version=3)
        assert torch.equal(got.view(torch.int16), new.view(torch.int16))
