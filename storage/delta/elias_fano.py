"""Elias-Fano coding of a strictly increasing set of positions in [0, universe).

With k positions out of u, each position is split into L = floor(log2(u/k)) low bits, stored
verbatim as L bit-planes, and a high part stored in unary as one bit-vector of k + (u-1 >> L) + 1
bits (bit high_i + i is set). That is at most k * (2 + log2(u/k)) bits, within about half a
bit per position of log2 C(u, k). Everything is vectorised: Python loops run over bit-planes,
never over positions.
"""

from __future__ import annotations

import struct

import numpy as np

_HEADER = struct.Struct("<QQB")  # count, universe, low bits


class EliasFanoError(ValueError):
    """Malformed Elias-Fano bytes or invalid positions."""


def low_bits(count: int, universe: int) -> int:
    """L = floor(log2(universe / count)), the split that minimises the size (0 if dense)."""
    if count == 0 or universe <= count:
        return 0
    return (universe // count).bit_length() - 1


def _high_bits(count: int, universe: int, low: int) -> int:
    return count + ((universe - 1) >> low) + 1 if count else 0


def encoded_size(count: int, universe: int) -> int:
    """Exact byte size of `encode` for `count` positions in [0, universe), without encoding."""
    low = low_bits(count, universe)
    return _HEADER.size + low * ((count + 7) // 8) + (_high_bits(count, universe, low) + 7) // 8


def encode(positions: np.ndarray, universe: int) -> bytes:
    """Elias-Fano bytes of sorted, distinct `positions` (ints in [0, universe))."""
    pos = np.asarray(positions)
    if pos.ndim != 1:
        raise EliasFanoError(f"positions must be 1-d, got shape {pos.shape}")
    count = int(pos.size)
    if universe < 0 or universe >= 1 << 63:
        raise EliasFanoError(f"universe {universe} out of range [0, 2**63)")
    if count:
        pos = pos.astype(np.uint64, copy=False) if pos.dtype.kind == "u" else pos.astype(np.int64)
        if (pos.dtype.kind == "i" and pos[0] < 0) or int(pos[-1]) >= universe:
            raise EliasFanoError(f"positions must lie in [0, {universe})")
        if count > 1 and not bool(np.all(pos[1:] > pos[:-1])):
            raise EliasFanoError("positions must be strictly increasing")
        pos = pos.astype(np.uint64, copy=False)
    low = low_bits(count, universe)
    parts = [_HEADER.pack(count, universe, low)]
    if count:
        lows = pos & np.uint64((1 << low) - 1)
        for bit in range(low):
            plane = (lows >> np.uint64(bit)) & np.uint64(1)
            parts.append(np.packbits(plane.astype(np.uint8), bitorder="little").tobytes())
        nbits = _high_bits(count, universe, low)
        unary = np.zeros(nbits, np.uint8)
        unary[(pos >> np.uint64(low)) + np.arange(count, dtype=np.uint64)] = 1
        parts.append(np.packbits(unary, bitorder="little").tobytes())
    return b"".join(parts)


def decode(data: bytes | memoryview) -> tuple[np.ndarray, int]:
    """(positions as int64, universe) from `encode`'s bytes; raises EliasFanoError if malformed."""
    buf = memoryview(data)
    if len(buf) < _HEADER.size:
        raise EliasFanoError(f"Elias-Fano block of {len(buf)} bytes is shorter than its header")
    count, universe, low = _HEADER.unpack_from(buf)
    if universe >= 1 << 63 or count > universe or low != low_bits(count, universe):
        raise EliasFanoError(f"bad Elias-Fano header (count={count}, universe={universe}, L={low})")
    if len(buf) != encoded_size(count, universe):
        raise EliasFanoError(
            f"Elias-Fano block is {len(buf)} bytes, header implies {encoded_size(count, universe)}")
    if count == 0:
        return np.zeros(0, np.int64), universe
    plane_bytes = (count + 7) // 8
    offset = _HEADER.size
    lows = np.zeros(count, np.uint64)
    for bit in range(low):
        plane = np.frombuffer(buf, np.uint8, plane_bytes, offset)
        lows |= np.unpackbits(plane, count=count, bitorder="little").astype(np.uint64) << np.uint64(bit)
        offset += plane_bytes
    nbits = _high_bits(count, universe, low)
    unary = np.unpackbits(np.frombuffer(buf, np.uint8, offset=offset), count=nbits, bitorder="little")
    ones = np.flatnonzero(unary)
    if ones.size != count:
        raise EliasFanoError(f"Elias-Fano high part holds {ones.size} positions, header says {count}")
    highs = ones.astype(np.uint64) - np.arange(count, dtype=np.uint64)
    pos = (highs << np.uint64(low)) | lows
    if int(pos[-1]) >= universe or (count > 1 and not bool(np.all(pos[1:] > pos[:-1]))):
        raise EliasFanoError("decoded positions are out of range or not increasing")
    return pos.astype(np.int64), universe
