"""Compiled kernels for the `ternary` encoding's symbols (storage/delta/ternary.py), both ways.

Encoding is two passes: each element's wrapped difference d = new - base becomes a 2-bit
symbol min(d + 1, 3) (-1, same, +1, escape), four to a byte, then each escape keeps d
zigzagged. Decoding joins the escapes' byte planes, then makes one pass straight onto the
base (or a copy of it). numpy needed about ten temporaries per chunk for the same
work, which on the ~100 KB tensors of a small policy cost more than the zstd stage after it.
Like storage/delta/kernels.py: numba, nogil, cached on disk, no exception inside a kernel.
"""
from __future__ import annotations

import numba
import numpy as np

from storage.delta.kernel_args import read_only as _ro

_ESCAPE, _SAME = 3, 1


@numba.njit(nogil=True, cache=True)
def _symbol(new: np.ndarray, base: np.ndarray, i: int, mask: np.uint64) -> np.uint64:
    return min((np.uint64(new[i]) - np.uint64(base[i]) + np.uint64(1)) & mask,
               np.uint64(_ESCAPE))


@numba.njit(nogil=True, cache=True)
def _symbols(new: np.ndarray, base: np.ndarray, width: int, packed: np.ndarray,
             escapes: np.ndarray) -> int:
    """Fill `packed` (padding symbols _SAME) and `escapes` (room for every element); the
    escapes written. Two passes: the symbols (four elements to a byte, no branch, so it
    vectorises), then the escapes, branch-free: every element's zigzag is stored and kept
    only if it is an escape (where half the elements are, a branch would mispredict)."""
    mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - width)
    top = np.uint64(width - 1)
    n = new.size
    for j in range(n // 4):
        i = 4 * j
        packed[j] = np.uint8(_symbol(new, base, i, mask)
                             | (_symbol(new, base, i + 1, mask) << np.uint64(2))
                             | (_symbol(new, base, i + 2, mask) << np.uint64(4))
                             | (_symbol(new, base, i + 3, mask) << np.uint64(6)))
    if n % 4:
        byte = np.uint64(0)
        for q in range(4):  # the last byte's unused fields: _SAME
            i = 4 * (n // 4) + q
            symbol = _symbol(new, base, i, mask) if i < n else np.uint64(_SAME)
            byte |= symbol << np.uint64(2 * q)
        packed[n // 4] = np.uint8(byte)
    e = 0
    for i in range(n):
        d = (np.uint64(new[i]) - np.uint64(base[i])) & mask
        negative = (d >> top) & np.uint64(1)
        escapes[min(e, n - 1)] = ((d << np.uint64(1)) ^ (np.uint64(0) - negative)) & mask
        e += ((d + np.uint64(1)) & mask) >= _ESCAPE
    return e


def symbols(new: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(2-bit symbols packed four to a byte, LSB first; zigzagged escapes, new's dtype) of the
    wrapped differences new - base (unsigned arrays of one dtype and size)."""
    packed = np.empty((new.size + 3) // 4, np.uint8)
    escapes = np.empty(max(new.size, 1), new.dtype)
    used = _symbols(_ro(new), _ro(base), 8 * new.itemsize, packed, escapes)
    return packed, escapes[:used]


@numba.njit(nogil=True, cache=True)
def _apply(packed: np.ndarray, planes: np.ndarray, width: int, base: np.ndarray,
           out: np.ndarray) -> int:
    """out = base + d for every element (out may be base); the escapes read, or -1 when the
    symbols call for more escapes than the planes hold. Branch-free like _symbols: every
    element reads the next escape (from a zero past the last) and keeps it only if it is one."""
    mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - width)
    nbytes = width // 8
    escapes = planes.size // nbytes
    zigs = np.zeros(escapes + 1, base.dtype)  # the planes joined, and a zero past the last
    for b in range(nbytes):
        for e in range(escapes):
            zigs[e] |= base.dtype.type(planes[b * escapes + e]) << base.dtype.type(8 * b)
    e = 0
    for i in range(base.size):
        symbol = np.uint64((packed[i >> 2] >> np.uint8(2 * (i & 3))) & np.uint8(3))
        escape = symbol == _ESCAPE
        zig = np.uint64(zigs[min(e, escapes)])
        coded = (zig >> np.uint64(1)) ^ (np.uint64(0) - (zig & np.uint64(1)))
        d = coded if escape else symbol - np.uint64(1)  # symbol 0 wraps to -1
        out[i] = (np.uint64(base[i]) + d) & mask
        e += escape
    return e if e <= escapes else -1


def apply(packed: np.ndarray, planes: np.ndarray, base: np.ndarray,
          in_place: bool = False) -> np.ndarray:
    """`base` plus the differences coded by `packed` symbols and zigzagged escape `planes`
    (uint8, itemsize planes of every escape): a new array, or `base` written into when
    `in_place`. ValueError when symbols and escapes disagree (in place: `base` may be
    partly written)."""
    width = 8 * base.itemsize
    if packed.size < (base.size + 3) // 4 or planes.size % base.itemsize:
        raise ValueError("ternary symbols do not cover the tensor")
    out = base if in_place else np.empty_like(base)
    used = _apply(_ro(packed), _ro(planes), width, base if in_place else _ro(base), out)
    if used != planes.size // base.itemsize:
        raise ValueError(f"ternary symbols hold {'more' if used < 0 else used} escapes, "
                         f"{planes.size // base.itemsize} stored")
    return out


def warm_up(dtype: np.dtype) -> None:
    """Compile (or load) both kernels for `dtype` (unsigned), as they are called."""
    base = np.zeros(7, dtype)
    new = base.copy()
    new[1], new[3] = 1, 9
    packed, escapes = symbols(new, base)
    planes = np.ascontiguousarray(escapes.view(np.uint8).reshape(-1, base.itemsize).T)
    apply(packed, planes.reshape(-1), base)
    apply(packed, planes.reshape(-1), base.copy(), in_place=True)
