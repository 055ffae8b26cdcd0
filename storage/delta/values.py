"""Lossless coding of the changed values, as differences of bit patterns.

For each changed element the symbol is d = new - base (mod 2**w, read as signed). AdamW steps at
RL learning rates move most weights by one bf16 ulp, so d is mostly +-1. We code:
  - the sign of d: one bit each, packed (it is a fair coin, so this is at the entropy);
  - a magnitude class c = min(|d| - 1, 3), four 2-bit classes per byte, then zstd-1. zstd's
    Huffman stage then codes 4-tuples of classes, which lands within a few % of their entropy
    (coding one class per byte would waste most of a bit on the dominant +-1);
  - for c == 3, the escape |d| - 4 as byte planes (low bytes, then high bytes), then zstd-1.
Layout: sign bytes | u64 len + zstd(classes) | u64 len + zstd(escapes). Nothing when count is 0.
"""

from __future__ import annotations

import struct

import numpy as np

from storage.delta import zstd_io

_LEN = struct.Struct("<Q")
_ESCAPE = 3


def diff_symbols(new: np.ndarray, base: np.ndarray) -> np.ndarray:
    """new - base with wrap-around, in the unsigned dtype of both (the value symbol)."""
    return new - base


def encode_values(diff: np.ndarray) -> bytes:
    """Bytes for the non-zero wrapped differences `diff` (unsigned dtype, one per change)."""
    count = diff.size
    if count == 0:
        return b""
    udt = diff.dtype
    top = udt.type(1 << (udt.itemsize * 8 - 1))
    negative = diff >= top
    magnitude = np.where(negative, ~diff + udt.type(1), diff)
    if not bool(np.all(magnitude)):
        raise ValueError("value differences must be non-zero (only changed elements are coded)")
    classes = np.minimum(magnitude - udt.type(1), udt.type(_ESCAPE)).astype(np.uint8)
    escapes = magnitude[classes == _ESCAPE] - udt.type(_ESCAPE + 1)
    padded = np.zeros((count + 3) // 4 * 4, np.uint8)
    padded[:count] = classes
    quads = padded.reshape(-1, 4)
    packed = quads[:, 0] | (quads[:, 1] << 2) | (quads[:, 2] << 4) | (quads[:, 3] << 6)
    planes = np.ascontiguousarray(escapes.astype(udt.newbyteorder("<")).view(np.uint8)
                                  .reshape(-1, udt.itemsize).T)
    z_classes = zstd_io.compress(packed.tobytes(), 1)
    z_escapes = zstd_io.compress(planes.tobytes(), 1)
    return b"".join([np.packbits(negative, bitorder="little").tobytes(),
                     _LEN.pack(len(z_classes)), z_classes, _LEN.pack(len(z_escapes)), z_escapes])


def decode_values(data: bytes | memoryview, count: int, udt: np.dtype) -> np.ndarray:
    """The `count` wrapped differences coded by `encode_values`; ValueError if malformed."""
    buf = memoryview(data)
    if count == 0:
        if len(buf):
            raise ValueError(f"value block has {len(buf)} bytes for zero changes")
        return np.zeros(0, udt)
    sign_bytes = (count + 7) // 8
    z_classes, offset = _take_frame(buf, sign_bytes)
    z_escapes, offset = _take_frame(buf, offset)
    if offset != len(buf):
        raise ValueError(f"value block has {len(buf) - offset} trailing bytes")
    negative = np.unpackbits(np.frombuffer(buf, np.uint8, sign_bytes), count=count,
                             bitorder="little").astype(bool)
    packed = np.frombuffer(zstd_io.decompress(z_classes, (count + 3) // 4), np.uint8)
    quads = np.stack([packed & 3, (packed >> 2) & 3, (packed >> 4) & 3, packed >> 6], axis=1)
    classes = quads.reshape(-1)[:count]
    escaped = classes == _ESCAPE
    n_escapes = int(np.count_nonzero(escaped))
    raw = zstd_io.decompress(z_escapes, n_escapes * udt.itemsize)
    escapes = (np.frombuffer(raw, np.uint8).reshape(udt.itemsize, n_escapes).T.copy()
               .view(udt.newbyteorder("<")).reshape(-1).astype(udt))
    magnitude = classes.astype(udt) + udt.type(1)
    magnitude[escaped] = escapes + udt.type(_ESCAPE + 1)
    if not bool(np.all(magnitude)):
        raise ValueError("value block decodes to a zero difference")
    return np.where(negative, ~magnitude + udt.type(1), magnitude)


def _take_frame(buf: memoryview, offset: int) -> tuple[memoryview, int]:
    if offset + _LEN.size > len(buf):
        raise ValueError("value block is truncated")
    (size,) = _LEN.unpack_from(buf, offset)
    offset += _LEN.size
    if offset + size > len(buf):
        raise ValueError("value block is truncated")
    return buf[offset:offset + size], offset + size
