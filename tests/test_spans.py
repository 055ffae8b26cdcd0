"""A large tensor's blocks as entries of their own (storage/weights/spans.py): each span is
written into its range, raw or coded, in place or into a tensor of its own, and the spans'
hashes make the tensor's."""
from __future__ import annotations

import pytest
import torch

from storage.delta import blocks, encode_delta
from storage.delta.content_hash import content_hash
from storage.weights.buckets import CorruptBucket
from storage.weights.digest import tensor_hash
from storage.weights.payloads import raw_encoder
from storage.weights.spans import (SpanHashes, SpanTargets, decode_entry, flat_range, piece_bytes,
                                   pieces)


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(blocks, "SPLIT_BYTES", 16 << 10)
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 8 << 10)


def _versions(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(96, 128, generator=gen).to(torch.bfloat16)  # 24 KB: 3 blocks of 8 KB
    new = old.clone()
    moved = torch.rand(old.shape, generator=gen) < 0.05
    new[moved] = (old.float()[moved] + 0.01).to(torch.bfloat16)
    return old, new


def _entries(name, new, old, raw_every: int = 0):
    """(payload, meta, checksum) per span, every `raw_every`-th one sent raw."""
    out = []
    for i, (_, t, span) in enumerate(pieces({name: new}, split=True)):
        piece, base = flat_range(t, span), flat_range(old, span)
        if raw_every and i % raw_every == 0:
            data, meta = raw_encoder(name, piece)
            meta = {**meta, "encoding": "raw"}
        else:
            data, meta = encode_delta(piece, base, name=name, base_version=0, target_version=1), \
                {"encoding": "rsdt"}
        meta.update(dtype="bfloat16", shape=list(new.shape), span=list(span))
        out.append((memoryview(data), meta, f"{content_hash(memoryview(data)):016x}"))
    return out


def test_pieces_split_only_large_tensors_and_only_when_asked(small_blocks):
    old, new = _versions()
    small = torch.zeros(8, dtype=torch.bfloat16)
    got = pieces({"w": new, "b": small}, split=True)
    assert [(n, s) for n, _, s in got] == [("w", (0, 4096)), ("w", (4096, 8192)),
                                           ("w", (8192, 12288)), ("b", None)]
    assert sum(piece_bytes(p) for p in got) == new.numel() * 2 + 16
    assert [s for _, _, s in pieces({"w": new}, split=False)] == [None]


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("raw_every", [0, 2])
def test_spans_rebuild_the_tensor_bit_exact_and_its_hash(small_blocks, in_place, raw_every):
    old, new = _versions()
    held = {"w": old.clone()}
    targets, hashes = SpanTargets(held, in_place), SpanHashes()
    entries = _entries("w", new, old, raw_every)
    for payload, meta, checksum in reversed(entries):  # any order
        out = decode_entry("w", payload, meta, held, 0, targets, hashes, checksum, in_place)
    assert torch.equal(out.view(torch.int16), new.view(torch.int16))
    assert (out is held["w"]) == in_place
    if not in_place:
        assert torch.equal(held["w"], old)  # the base untouched
    assert hashes.tensors() == {"w": tensor_hash(new)}


def test_a_missing_span_leaves_a_hash_no_digest_matches(small_blocks):
    old, new = _versions()
    held, hashes = {"w": old.clone()}, SpanHashes()
    for payload, meta, checksum in _entries("w", new, old)[:-1]:
        decode_entry("w", payload, meta, held, 0, SpanTargets(held, True), hashes, checksum, True)
    assert hashes.tensors()["w"] != tensor_hash(new)


def test_a_raw_span_of_the_wrong_size_and_a_delta_span_without_base_are_refused(small_blocks):
    old, new = _versions()
    payload, meta, checksum = _entries("w", new, old, raw_every=1)[0]
    with pytest.raises(CorruptBucket, match="bytes for"):
        decode_entry("w", payload[:-2], meta, {}, 0, SpanTargets(None, False))
    payload, meta, checksum = _entries("w", new, old)[0]
    with pytest.raises(CorruptBucket, match="no matching base"):
        decode_entry("w", payload, meta, None, 0, SpanTargets(None, False))


def test_spans_in_place_need_the_held_tensor_itself(small_blocks):
    """Written through a flat view: a held tensor that is missing, of another shape or not
    contiguous (a view would be a copy, the writes lost) is refused, naming it."""
    old, new = _versions()
    payload, meta, checksum = _entries("w", new, old)[0]
    for held in ({}, {"w": old.reshape(128, 96)}, {"w": old.t().contiguous().t()}):
        with pytest.raises(CorruptBucket, match="no held"):
            decode_entry("w", payload, meta, held, 0, SpanTargets(held, True), in_place=True)
