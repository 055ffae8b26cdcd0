"""Compiled kernels for the changed values' symbols (storage/delta/values.py), both ways.

Each changed element's wrapped difference d = new - base is coded as a sign bit, a 2-bit
magnitude class min(|d| - 1, 3) (four to a byte) and, for class 3, an escape |d| - 4 (byte
planes). `value_symbols` splits differences into those symbols in one pass; `decode_values`
joins them back in one pass straight into the output, where numpy needed a table lookup,
a scan for the escapes and four temporaries the size of the changes (a third of a sparse
delta's apply time). Like storage/delta/kernels.py: numba, nogil, cached on disk, and no
exception inside a kernel (a malformed block is reported by the caller as ValueError).
"""
from __future__ import annotations

import numba
import numpy as np

from storage.delta.kernel_args import read_only as _ro

_ESCAPE = 3


@numba.njit(nogil=True, cache=True)
def _value_symbols(diff: np.ndarray, width: int, signs: np.ndarray, classes: np.ndarray,
                   escapes: np.ndarray) -> int:
    top = np.uint64(width - 1)
    mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - width)
    e = 0
    for i in range(diff.size):
        u = np.uint64(diff[i])
        negative = (u >> top) & np.uint64(1)
        magnitude = ((~u + np.uint64(1)) & mask) if negative else u
        if magnitude == 0:
            return -1
        c = min(magnitude - np.uint64(1), np.uint64(3))
        signs[i >> 3] |= np.uint8(negative << np.uint64(i & 7))
        classes[i >> 2] |= np.uint8(c << np.uint64(2 * (i & 3)))
        if c == 3:
            escapes[e] = magnitude - np.uint64(4)
            e += 1
    return e


def value_symbols(diff: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sign bits, 2-bit magnitude classes packed four to a byte, escapes) of the wrapped
    differences `diff` read as signed (values.py's symbols, LSB first), in one pass.
    ValueError when a difference is zero."""
    count = diff.size
    signs = np.zeros((count + 7) // 8, np.uint8)
    classes = np.zeros((count + 3) // 4, np.uint8)
    escapes = np.empty(count, diff.dtype)
    used = _value_symbols(_ro(diff), 8 * diff.itemsize, signs, classes, escapes)
    if used < 0:
        raise ValueError("value differences must be non-zero (only changed elements are coded)")
    return signs, classes, escapes[:used]


@numba.njit(nogil=True, cache=True)
def _escapes(classes: np.ndarray, count: int) -> int:
    """How many of the first `count` classes are escapes."""
    e = 0
    for i in range(count):
        e += ((classes[i >> 2] >> np.uint8(2 * (i & 3))) & np.uint8(3)) == _ESCAPE
    return e


def escape_count(classes: np.ndarray, count: int) -> int:
    """Escapes among the first `count` 2-bit classes packed in `classes` (its bytes)."""
    return int(_escapes(_ro(classes), count))


@numba.njit(nogil=True, cache=True)
def _decode(signs: np.ndarray, classes: np.ndarray, planes: np.ndarray, width: int,
            out: np.ndarray) -> int:
    """Escapes read, or -1 when the classes call for more than the planes hold."""
    escapes = planes.size // width
    e = 0
    for i in range(out.size):
        c = np.uint64((classes[i >> 2] >> np.uint8(2 * (i & 3))) & np.uint8(3))
        if c == _ESCAPE:
            if e == escapes:
                return -1
            magnitude = np.uint64(0)
            for b in range(width):  # byte planes: every escape's low byte, then the next
                magnitude |= np.uint64(planes[b * escapes + e]) << np.uint64(8 * b)
            magnitude += np.uint64(_ESCAPE + 1)
            e += 1
        else:
            magnitude = c + np.uint64(1)
        if (signs[i >> 3] >> np.uint8(i & 7)) & np.uint8(1):
            magnitude = ~magnitude + np.uint64(1)  # wraps in out's width
        out[i] = magnitude
    return e


def decode_values(signs: np.ndarray, classes: np.ndarray, planes: np.ndarray, count: int,
                  udt: np.dtype) -> np.ndarray:
    """The `count` wrapped differences (unsigned `udt`) from their symbols: sign bits, packed
    classes and the escapes' byte planes (escape_count(classes, count) * itemsize bytes)."""
    width = np.dtype(udt).itemsize
    if signs.size < (count + 7) // 8 or classes.size < (count + 3) // 4 or planes.size % width:
        raise ValueError("value symbols do not match their count")
    out = np.empty(count, udt)
    if _decode(_ro(signs), _ro(classes), _ro(planes), width, out) != planes.size // width:
        raise ValueError("value symbols do not match their count (escapes)")
    return out


def warm_up(diff: np.ndarray) -> None:
    """Compile (or load) these kernels for `diff`'s dtype: differences, symbols and back."""
    signs, classes, escapes = value_symbols(diff)
    planes = np.ascontiguousarray(escapes.view(np.uint8).reshape(-1, diff.itemsize).T)
    decode_values(signs, classes, planes.reshape(-1), diff.size, diff.dtype)
