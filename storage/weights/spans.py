"""A large tensor's blocks as entries of their own in a streamed coded delta.

Coded as one payload, a tensor of blocks.SPLIT_BYTES or more (the 0.5B shape's embedding, a
quarter of it) went out only once every block was coded, and was applied only once all of it
had landed: the streaming receiver sat idle behind it, and with a core per side its apply was
the whole tail of a publish. In a streamed coded delta it goes out as span entries instead,
one per block (blocks.ranges), each a payload of that range of the flattened tensor (entry
meta `span`: [start, end) in elements), which a receiver applies into that range as it lands.
The tensor's hash is made of its spans' (content_hash.combine), so the digest reads no bit
twice. Full snapshots, deltas sent all raw and sharded parts keep one entry per tensor.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from storage.delta import blocks, read_header
from storage.delta.apply import apply_delta
from storage.delta.bits import DTYPE_CODES, to_bits
from storage.delta.content_hash import combine, composes
from storage.weights.buckets import CorruptBucket
from storage.weights.payloads import decode_payload, entry_dtype, shape_bytes

Span = tuple[int, int]
Piece = tuple[str, torch.Tensor, "Span | None"]  # name, the whole tensor, its range or None


def pieces(tensors: dict[str, torch.Tensor], split: bool) -> list[Piece]:
    """What a publish encodes, in order: each tensor whole, or (`split`) a large one's blocks."""
    out: list[Piece] = []
    for name, t in tensors.items():
        size = t.element_size()
        if split and t.dtype in DTYPE_CODES and t.is_contiguous() and composes(size) \
                and blocks.splits(t.numel() * size):
            out += [(name, t, span) for span in blocks.ranges(t.numel(), size)]
        else:
            out.append((name, t, None))
    return out


def piece_bytes(piece: Piece) -> int:
    _, t, span = piece
    return (t.numel() if span is None else span[1] - span[0]) * t.element_size()


def flat_range(t: torch.Tensor, span: Span) -> torch.Tensor:
    """The elements [start, end) of a contiguous tensor, flattened: a view, not a copy."""
    return t.reshape(-1)[span[0]:span[1]]


def span_of(name: str, meta: dict[str, Any], numel: int) -> Span | None:
    """An entry's span, checked against its tensor's size; None for a whole tensor."""
    span = meta.get("span")
    if span is None:
        return None
    if not (isinstance(span, list) and len(span) == 2 and all(type(x) is int for x in span)
            and 0 <= span[0] < span[1] <= numel):
        raise CorruptBucket(f"tensor {name!r}: span {span!r} is not a range of its {numel} "
                            "elements")
    return span[0], span[1]


def entry_bytes(meta: dict[str, Any]) -> int:
    """Bytes an entry rewrites (a decoding cost estimate): its span's share of its tensor's."""
    span, whole = meta.get("span"), shape_bytes(meta)
    numel = int(np.prod(meta.get("shape", []), dtype=np.int64))
    return whole if not span or not numel else whole * (span[1] - span[0]) // numel


class SpanHashes:
    """Per tensor, its spans' content hashes; combined, the tensor's (content_hash.py)."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()

    def add(self, name: str, start: int, checksum: int) -> None:
        with self._lock:
            self._by_name.setdefault(name, {})[start] = checksum

    def tensors(self) -> dict[str, int]:
        """name -> tensor hash; a tensor missing a span gets a hash no digest matches."""
        return {n: combine([h for _, h in sorted(d.items())]) for n, d in self._by_name.items()}


class SpanTargets:
    """The tensor each span is written into: the held one (in place), else one allocated at
    its tensor's first span."""

    def __init__(self, held: dict[str, torch.Tensor] | None, in_place: bool) -> None:
        self.held, self.in_place = held or {}, in_place
        self._made: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def target(self, name: str, meta: dict[str, Any], dtype: torch.dtype) -> torch.Tensor:
        if self.in_place:  # written through a flat view: it must be that very memory
            held = self.held.get(name)
            if held is None or not held.is_contiguous() or held.dtype != dtype \
                    or list(held.shape) != list(meta["shape"]):
                raise CorruptBucket(f"tensor {name!r}: no held {meta.get('dtype')}"
                                    f"{meta['shape']} to write its spans into")
            return held
        with self._lock:
            if name not in self._made:
                self._made[name] = torch.empty(list(meta["shape"]), dtype=dtype)
            return self._made[name]


def decode_entry(name: str, payload: memoryview, meta: dict[str, Any],
                 base: dict[str, torch.Tensor] | None, base_version: int | None,
                 targets: SpanTargets, hashes: SpanHashes | None = None,
                 checksum: str | None = None, in_place: bool = False) -> torch.Tensor:
    """decode_payload for any entry: a span is written into its tensor's range (`targets`),
    its hash kept in `hashes` (a delta's verified result checksum, else the entry's
    `checksum`); the tensor returned is the whole one."""
    span = span_of(name, meta, int(np.prod(meta.get("shape", []), dtype=np.int64)))
    if span is None:
        return decode_payload(name, payload, meta, base, base_version, in_place)
    dtype = entry_dtype(meta)
    if dtype not in DTYPE_CODES:
        raise CorruptBucket(f"tensor {name!r}: a span of dtype {meta.get('dtype')!r}")
    into = targets.target(name, meta, dtype)
    held = (base or {}).get(name)
    got = _decode_span(name, payload, meta, span, into, held, base_version, targets.in_place)
    if hashes is not None and (got is not None or checksum is not None):
        hashes.add(name, span[0], got if got is not None else int(checksum, 16))
    return into


def _decode_span(name: str, payload: memoryview, meta: dict[str, Any], span: Span,
                 into: torch.Tensor, base: torch.Tensor | None, base_version: int | None,
                 in_place: bool) -> int | None:
    """Write one span entry into its range of `into`; the span's content hash when the
    payload states it (a delta's verified result checksum), None for raw bytes (the bucket
    entry's checksum is it). A delta not `in_place` starts from `base`'s range."""
    dest = flat_range(into, span)
    encoding = meta.get("encoding")
    if encoding == "raw":
        if payload.nbytes != dest.numel() * dest.element_size():
            raise CorruptBucket(f"tensor {name!r} span {list(span)}: {payload.nbytes} bytes "
                                f"for {dest.numel()} elements")
        np.copyto(to_bits(dest), np.frombuffer(payload, to_bits(dest).dtype))
        return None
    if encoding != "rsdt":
        raise CorruptBucket(f"tensor {name!r}: a span cannot be {encoding!r}")
    if not in_place:
        if base is None or base.shape != into.shape or base.dtype != into.dtype:
            raise CorruptBucket(f"tensor {name!r}: a delta span with no matching base held")
        dest.copy_(flat_range(base, span))
    apply_delta(payload, dest, base_version=base_version, in_place=True)
    return read_header(payload).result_checksum


def hashes_of_raw(entries: Iterable[Any], into: SpanHashes) -> None:
    """Raw span entries' checksums into `into` (a raw entry's checksum is its bytes' hash)."""
    for e in entries:
        if e.meta.get("encoding") == "raw" and e.meta.get("span"):
            into.add(e.name, e.meta["span"][0], int(e.checksum, 16))
