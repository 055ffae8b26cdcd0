"""The `ternary` encoding: one 2-bit symbol per element, for deltas where many elements change.

Symbol of d = new - base (mod 2**w): 0 for d = -1, 1 for unchanged, 2 for d = +1, 3 (escape)
otherwise; computed as min(d + 1, 3). Four symbols per byte, then zstd-1: Huffman over the bytes
codes 4-tuples, so positions and +-1 values together cost close to their joint entropy
n * H(p) + k * H(value), with no position list at all. Escapes keep their d, zigzagged, as byte
planes + zstd-1. Above ~15% density this is smaller than Elias-Fano or a bitmap; on structured
change sets (whole rows, strides) zstd finds the repeats and it is far smaller still. Encode and
decode are chunked passes over the elements that stay in cache.
Body: u64 len + zstd(symbol bytes) | u64 escape count | zstd(escape planes).
"""

from __future__ import annotations

import struct

import numpy as np

from storage.delta import zstd_io

_LEN = struct.Struct("<Q")
_CHUNK = 1 << 18  # elements per step; a multiple of 4
_ESCAPE, _SAME = 3, 1
_SIGNED = {1: np.dtype("i1"), 2: np.dtype("<i2"), 4: np.dtype("<i4"), 8: np.dtype("<i8")}
_TABLES: dict[np.dtype, np.ndarray] = {}
_MARK = 2  # what the decode table yields for an escape: any value other than -1, 0, +1


def encode(new: np.ndarray, base: np.ndarray) -> bytes:
    udt, n = new.dtype, new.size
    packed = np.empty((n + 3) // 4, np.uint8)
    escapes = []
    for start in range(0, n, _CHUNK):
        d = new[start:start + _CHUNK] - base[start:start + _CHUNK]
        sym = np.full(d.size + (-d.size) % 4, _SAME, np.uint8)
        np.minimum(d + udt.type(1), udt.type(_ESCAPE), out=sym[:d.size], casting="unsafe")
        word = sym.view("<u4")  # 4 symbol bytes -> one byte of 4 2-bit fields
        chunk = (word | (word >> 6) | (word >> 12) | (word >> 18)).astype(np.uint8)
        packed[start // 4:start // 4 + chunk.size] = chunk
        signed = d[np.flatnonzero(sym[:d.size] == _ESCAPE)].view(_SIGNED[udt.itemsize])
        escapes.append(((signed << 1) ^ (signed >> (8 * udt.itemsize - 1))).view(udt))
    esc = np.concatenate(escapes) if escapes else np.zeros(0, udt)
    z_symbols = zstd_io.compress(packed, 1)
    planes = np.ascontiguousarray(esc.view(np.uint8).reshape(-1, udt.itemsize).T)
    return b"".join([_LEN.pack(len(z_symbols)), z_symbols, _LEN.pack(esc.size),
                     zstd_io.compress(planes, 1)])


def decode(body: memoryview, base: np.ndarray) -> np.ndarray:
    udt, n = base.dtype, base.size
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
    raw = zstd_io.decompress(body[2 * _LEN.size + z_len:], n_esc * udt.itemsize)
    zig = np.frombuffer(raw, np.uint8).reshape(udt.itemsize, -1).T.copy().view(udt).reshape(-1)
    esc = (zig >> udt.type(1)) ^ (udt.type(0) - (zig & udt.type(1)))  # un-zigzag, wrapping
    table = _table(udt)
    out = np.empty_like(base)
    used = 0
    for start in range(0, n, _CHUNK):
        chunk = packed[start // 4:(start + _CHUNK + 3) // 4]
        d = np.take(table, chunk).view(udt)[:min(_CHUNK, n - start)]
        where = np.flatnonzero(d == _MARK)
        if used + where.size > n_esc:
            raise ValueError("ternary symbols hold more escapes than stored")
        d[where] = esc[used:used + where.size]
        used += where.size
        np.add(base[start:start + d.size], d, out=out[start:start + d.size])
    if used != n_esc:
        raise ValueError(f"ternary symbols hold {used} escapes, {n_esc} stored")
    return out


def _table(udt: np.dtype) -> np.ndarray:
    """256 records: symbol byte -> its 4 differences (escapes as _MARK, replaced afterwards)."""
    if udt not in _TABLES:
        sym = (np.arange(256)[:, None] >> (2 * np.arange(4))) & 3
        diff = np.where(sym == _ESCAPE, _MARK, sym - 1).astype(np.int64).astype(udt)
        _TABLES[udt] = diff.view(np.dtype((np.void, 4 * udt.itemsize))).reshape(-1)
    return _TABLES[udt]
