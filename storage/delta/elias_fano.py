"""Elias-Fano coding of a strictly increasing set of positions in [0, universe).

With k positions out of u, each position is split into L = floor(log2(u/k)) low bits, stored
verbatim (k * L bits, position after position, least significant bit first), and a high part
stored in unary as one bit-vector of k + (u-1 >> L) + 1 bits (bit high_i + i is set). That is
at most k * (2 + log2(u/k)) bits, within about half a bit per position of log2 C(u, k).
Encoding runs in a compiled kernel (kernels.py); `decode` is vectorised numpy (the receiver's
apply decodes positions inside its own kernel instead).
"""

from __future__ import annotations

import struct

import numpy as np

from storage.delta import kernels
from storage.delta.bitpack import packed_size, unpack_bits

_HEADER = struct.Struct("<QQB")  # count, universe, low bits
_CHUNK = 1 << 16  # positions per vectorised step (a multiple of 8)


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
    return _HEADER.size + packed_size(count, low) + (_high_bits(count, universe, low) + 7) // 8


def encode(positions: np.ndarray, universe: int, *, check: bool = True) -> bytes:
    """Elias-Fano bytes of sorted, distinct `positions` (ints in [0, universe)).

    `check=False` skips validating the positions (for callers that produced them sorted).
    """
    return b"".join(encode_parts(positions, universe, check=check))


def encode_parts(positions: np.ndarray, universe: int, *, check: bool = True) -> list:
    """`encode`'s bytes as the buffers that make them up, in order (storage/delta/parts.py)."""
    pos = np.asarray(positions)
    if pos.ndim != 1:
        raise EliasFanoError(f"positions must be 1-d, got shape {pos.shape}")
    count = int(pos.size)
    if universe < 0 or universe >= 1 << 63:
        raise EliasFanoError(f"universe {universe} out of range [0, 2**63)")
    if count and pos.dtype.kind not in "iu":
        raise EliasFanoError(f"positions must be integers, got {pos.dtype}")
    if count and check:
        if int(pos[0]) < 0 or int(pos[-1]) >= universe:
            raise EliasFanoError(f"positions must lie in [0, {universe})")
        if count > 1 and not bool(np.all(pos[1:] > pos[:-1])):
            raise EliasFanoError("positions must be strictly increasing")
    pos = pos.astype(np.int64, copy=False)
    low = low_bits(count, universe)
    parts = [_HEADER.pack(count, universe, low)]
    if count:
        # Chunks of positions stay in cache; a multiple of 8 keeps each chunk's lows whole bytes.
        parts += kernels.ef_pack(pos, low, packed_size(count, low),
                                 _high_bits(count, universe, low))
    return parts


def split(data: bytes | memoryview) -> tuple[int, int, int, memoryview, memoryview]:
    """(count, universe, low bits, packed lows, unary high part) of `encode`'s bytes, the header
    and sizes checked (the positions themselves are checked by whoever decodes them)."""
    buf = memoryview(data)
    if len(buf) < _HEADER.size:
        raise EliasFanoError(f"Elias-Fano block of {len(buf)} bytes is shorter than its header")
    count, universe, low = _HEADER.unpack_from(buf)
    if universe >= 1 << 63 or count > universe or low != low_bits(count, universe):
        raise EliasFanoError(f"bad Elias-Fano header (count={count}, universe={universe}, L={low})")
    if len(buf) != encoded_size(count, universe):
        raise EliasFanoError(
            f"Elias-Fano block is {len(buf)} bytes, header implies {encoded_size(count, universe)}")
    offset = _HEADER.size + packed_size(count, low)
    return count, universe, low, buf[_HEADER.size:offset], buf[offset:]


def decode(data: bytes | memoryview) -> tuple[np.ndarray, int]:
    """(positions as int64, universe) from `encode`'s bytes; raises EliasFanoError if malformed."""
    buf = memoryview(data)
    count, universe, low, _, _ = split(buf)
    if count == 0:
        return np.zeros(0, np.int64), universe
    offset = _HEADER.size + packed_size(count, low)
    nbits = _high_bits(count, universe, low)
    unary = np.unpackbits(np.frombuffer(buf, np.uint8, offset=offset), count=nbits,
                          bitorder="little")
    ones = np.flatnonzero(unary.view(bool))
    if ones.size != count:
        raise EliasFanoError(f"Elias-Fano high part holds {ones.size} positions, "
                             f"header says {count}")
    pos = np.empty(count, np.int64)
    for i in range(0, count, _CHUNK):
        j = min(i + _CHUNK, count)
        start = _HEADER.size + i * low // 8  # whole bytes: i is a multiple of 8
        lows = unpack_bits(buf[start:start + packed_size(j - i, low)], j - i, low)
        chunk = pos[i:j]
        np.left_shift(ones[i:j] - np.arange(i, j), low, out=chunk)
        chunk |= lows.view(np.int64)
        if not bool(np.all(chunk[1:] > chunk[:-1])) or (i and chunk[0] <= pos[i - 1]):
            raise EliasFanoError("decoded positions are not increasing")
    if int(pos[-1]) >= universe:
        raise EliasFanoError("decoded positions are out of range")
    return pos, universe
