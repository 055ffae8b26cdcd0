"""Applying one tensor's delta payload, only onto its base: the result is checked bit for bit.

apply_delta returns a new tensor and never touches the base unless asked to write into it (in
place); any doubt raises DeltaBaseMismatch or CorruptPayload, and the receiver then asks for a
full snapshot. A payload in blocks (blocks.py) is applied block by block on every core.
"""
from __future__ import annotations

import numpy as np
import torch
import xxhash

from storage.delta import bits, blocks, encodings as enc
from storage.delta.content_hash import content_hash
from storage.delta.errors import CorruptPayload, DeltaBaseMismatch
from storage.delta.header import DeltaHeader, unpack_header


def apply_delta(payload: bytes | memoryview, base: torch.Tensor | None, *,
                base_version: int | None, in_place: bool = False) -> torch.Tensor:
    """The tensor the payload encodes, built from `base` (held by the receiver as `base_version`).

    Raises DeltaBaseMismatch when the payload needs another base than the one given, and
    CorruptPayload when the bytes are damaged. `base` is never modified, unless `in_place`
    (a contiguous CPU base of the payload's dtype and shape): the result is then written into
    `base`, which is returned, and no tensor-sized buffer is allocated for a sparse delta (fresh
    memory is what a pull pays most for: every page faults in). In place, an error raised after
    the header and body checks (a result checksum that differs: the base was not the sender's)
    may leave `base` partly written: its holder must treat it as no version.
    """
    buf = memoryview(payload)
    head = unpack_header(buf)
    where = f"{head.name} (v{head.base_version} -> v{head.target_version})"
    body = _checked_body(buf, head, where)
    base_u = _check_base(head, base, base_version, where)
    into = _in_place_target(head, base, where) if in_place else None
    if head.encoding == "blocks":  # each block checked against its own result checksum
        out = _apply_blocks(head, body, base_u, into, where)
    else:
        out = _decode(head, body, base_u, into, where)
        if content_hash(out) != head.result_checksum:
            raise _mismatch(where)
    return base if into is not None else bits.from_bits(out, head.dtype, head.shape)


def _checked_body(buf: memoryview, head: DeltaHeader, where: str) -> memoryview:
    body = buf[head.header_length:]
    if len(body) != head.body_length:
        raise CorruptPayload(f"{where}: body is {len(body)} bytes, header says {head.body_length}"
                             + (" (truncated)" if len(body) < head.body_length else ""))
    if xxhash.xxh3_64_intdigest(body) != head.body_checksum:
        raise CorruptPayload(f"{where}: body checksum mismatch")
    return body


def _mismatch(where: str) -> DeltaBaseMismatch:
    # The body is intact (its checksum passed), so the base differs from the sender's.
    return DeltaBaseMismatch(f"{where}: result checksum mismatch; the base's content differs "
                             "from the sender's base")


def _decode(head: DeltaHeader, body: memoryview, base_u: np.ndarray | None,
            into: np.ndarray | None, where: str) -> np.ndarray:
    """The result's bits: written into `into` (holding the base) when given, else new."""
    udt = bits.uint_dtype(head.dtype)
    try:
        if into is not None and head.encoding in ("ef", "ternary"):
            decode = enc.decode_ef if head.encoding == "ef" else enc.decode_ternary
            out = decode(body, into, in_place=True)
        elif head.encoding == "dense":
            out = enc.decode_dense(body, head.numel, udt)
        elif head.encoding == "xor_zstd":
            out = enc.decode_xor_zstd(body, base_u)
        elif head.encoding == "coo":
            out = enc.decode_coo(body, base_u)
        elif head.encoding == "ef":
            out = enc.decode_ef(body, base_u)
        elif head.encoding == "ternary":
            out = enc.decode_ternary(body, base_u)
        else:
            raise ValueError(f"a {head.encoding} payload inside another")
    except (ValueError, IndexError) as exc:
        raise CorruptPayload(f"{where}: {head.encoding} body does not decode: {exc}") from exc
    if into is not None and out is not into:  # decoded aside (rare encodings): copy it in
        np.copyto(into, out)
        out = into
    return out


def _apply_blocks(head: DeltaHeader, body: memoryview, base_u: np.ndarray,
                  into: np.ndarray | None, where: str) -> np.ndarray:
    """Every block decoded into its range of `into` (else of a copy of the base), on the block
    threads; a block that is not a payload of this tensor's range raises CorruptPayload."""
    try:
        spans = blocks.unpack(body, head.numel)
    except ValueError as exc:
        raise CorruptPayload(f"{where}: blocks body does not decode: {exc}") from exc
    out = into if into is not None else np.empty_like(base_u)

    def one(span: tuple[int, int, memoryview]) -> None:
        start, end, payload = span
        at = f"{where} block [{start}, {end})"
        sub = unpack_header(payload)
        if sub.numel != end - start or sub.dtype != head.dtype or \
                sub.base_version not in (None, head.base_version) or \
                sub.target_version != head.target_version:
            raise CorruptPayload(f"{at}: holds {sub.dtype}[{sub.numel}] v{sub.base_version} -> "
                                 f"v{sub.target_version}")
        dest = out[start:end]
        if into is None:
            np.copyto(dest, base_u[start:end])
        _decode(sub, _checked_body(payload, sub, at), dest, dest, at)
        if content_hash(dest) != sub.result_checksum:
            raise _mismatch(at)
    blocks.gather(blocks.submit(one, spans))
    return out


def writable_base(base: torch.Tensor | None, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    """Whether apply_delta can write a `dtype` `shape` result into `base` (in_place=True)."""
    return base is not None and base.device.type == "cpu" and base.is_contiguous() \
        and base.dtype == dtype and tuple(base.shape) == tuple(shape)


def _in_place_target(head: DeltaHeader, base: torch.Tensor | None, where: str) -> np.ndarray:
    """The bits of `base` to decode into (the same memory), or ValueError."""
    if not writable_base(base, head.dtype, head.shape):
        raise ValueError(f"{where}: applying in place needs a contiguous CPU {head.dtype}"
                         f"{head.shape} tensor to write into")
    return bits.to_bits(base)


def _check_base(head: DeltaHeader, base: torch.Tensor | None, base_version: int | None,
                where: str) -> np.ndarray | None:
    if head.encoding not in enc.NEEDS_BASE:
        return None
    if base is None:
        raise DeltaBaseMismatch(f"{where}: payload is a delta but no base tensor was given")
    if base_version != head.base_version:
        raise DeltaBaseMismatch(f"{where}: payload applies to base v{head.base_version}, "
                                f"receiver holds v{base_version}")
    if base.dtype != head.dtype or tuple(base.shape) != head.shape:
        raise DeltaBaseMismatch(f"{where}: base is {base.dtype}{tuple(base.shape)}, payload "
                                f"needs {head.dtype}{head.shape}")
    return bits.to_bits(base)
