"""The `ternary` encoding: one 2-bit symbol per element, for deltas where many elements change.

Symbol of d = new - base (mod 2**w): 0 for d = -1, 1 for unchanged, 2 for d = +1, 3 (escape)
otherwise; computed as min(d + 1, 3). Four symbols per byte, then zstd-1: Huffman over the bytes
codes 4-tuples, so positions and +-1 values together cost close to their joint entropy
n * H(p) + k * H(value), with no position list at all. Escapes keep their d, zigzagged, as byte
planes + zstd-1. Above ~15% density this is smaller than Elias-Fano or a bitmap; on structured
change sets (whole rows, strides) zstd finds the repeats and it is far smaller still. Symbols and
escapes are made and applied in one compiled pass each (storage/delta/ternary_kernels.py).
Body: u64 len + zstd(symbol bytes) | u64 escape count | zstd(escape planes).
"""

from __future__ import annotations

import struct

import numpy as np

from storage.delta import ternary_kernels, zstd_io

_LEN = struct.Struct("<Q")


def encode(new: np.ndarray, base: np.ndarray) -> bytes:
    packed, escapes = ternary_kernels.symbols(new, base)
    z_symbols = zstd_io.compress(packed, 1)
    planes = np.ascontiguousarray(escapes.view(np.uint8).reshape(-1, new.itemsize).T)
    return b"".join([_LEN.pack(len(z_symbols)), z_symbols, _LEN.pack(escapes.size),
                     zstd_io.compress(planes, 1)])


def decode(body: memoryview, base: np.ndarray, in_place: bool = False) -> np.ndarray:
    """`base` with the body's differences added: a new array, or `base` itself written into
    when `in_place` (ValueError on a malformed body; in place, `base` may be partly written)."""
    n, itemsize = base.size, base.itemsize
    if len(body) < _LEN.size:
        raise ValueError("ternary body is truncated")
    (z_len,) = _LEN.unpack_from(body)
    if 2 * _LEN.size + z_len > len(body):
        raise ValueError("ternary body is truncated")
    packed = np.frombuffer(zstd_io.decompress(body[_LEN.size:_LEN.size + z_len], (n + 3) // 4),
                           np.uint8)
    (n_esc,) = _LEN.unpack_from(body, _LEN.size + z_len)
    if n_esc > n:
        raise ValueError(f"ternary body claims {n_esc} escapes for {n} elements")
    planes = np.frombuffer(zstd_io.decompress(body[2 * _LEN.size + z_len:], n_esc * itemsize),
                           np.uint8)
    return ternary_kernels.apply(packed, planes, base, in_place)
