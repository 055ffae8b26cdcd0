"""Lossless coding of the changed values, as differences of bit patterns.

For each changed element the symbol is d = new - base (mod 2**w, read as signed). AdamW steps at
RL learning rates move most weights by one bf16 ulp, so d is mostly +-1. We code:
  - the sign of d: one bit each, packed (it is a fair coin, so this is at the entropy);
  - a magnitude class c = min(|d| - 1, 3), four 2-bit classes per byte, then zstd-1. zstd's
    Huffman stage then codes 4-tuples of classes, which lands within a few % of their entropy
    (one class per byte would waste most of a bit on the dominant +-1);
  - for c == 3, the escape |d| - 4 as byte planes (low bytes, then high bytes), then zstd-1.
Layout: sign bytes | u64 len + zstd(classes) | u64 len + zstd(escapes). Nothing when count is 0.
"""

from __future__ import annotations

import struct

import numpy as np

from storage.delta import value_kernels, zstd_io

_LEN = struct.Struct("<Q")


def encode_values(diff: np.ndarray) -> bytes:
    """Bytes for the non-zero wrapped differences `diff` (unsigned dtype, one per change)."""
    return b"".join(encode_values_parts(diff))


def encode_values_parts(diff: np.ndarray) -> list:
    """`encode_values`' bytes as the buffers that make them up (storage/delta/parts.py)."""
    count = diff.size
    if count == 0:
        return []
    udt = diff.dtype
    signs, packed, escapes = value_kernels.value_symbols(diff)
    planes = np.ascontiguousarray(escapes.view(np.uint8).reshape(-1, udt.itemsize).T)
    z_classes = zstd_io.compress(packed, 1)
    z_escapes = zstd_io.compress(planes, 1)
    return [signs, _LEN.pack(len(z_classes)), z_classes, _LEN.pack(len(z_escapes)), z_escapes]


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
    signs = np.frombuffer(buf, np.uint8, sign_bytes)
    classes = np.frombuffer(zstd_io.decompress(z_classes, (count + 3) // 4), np.uint8)
    escapes = value_kernels.escape_count(classes, count)
    planes = np.frombuffer(zstd_io.decompress(z_escapes, escapes * udt.itemsize), np.uint8)
    return value_kernels.decode_values(signs, classes, planes, count, udt)


def _take_frame(buf: memoryview, offset: int) -> tuple[memoryview, int]:
    if offset + _LEN.size > len(buf):
        raise ValueError("value block is truncated")
    (size,) = _LEN.unpack_from(buf, offset)
    offset += _LEN.size
    if offset + size > len(buf):
        raise ValueError("value block is truncated")
    return buf[offset:offset + size], offset + size
