"""Fixed-width bit packing: `count` values of `width` bits as one LSB-first bit stream.

Value i occupies bits [i*width, (i+1)*width) of the stream, least significant bit first, bytes
little-endian: the layout a C bit-writer would produce. Vectorised two ways: widths up to 8 pack
8 values into `width` bytes of one uint64; wider values go word by word with a spill into the
next word (they only occur for very sparse changes, where counts are small).
"""

from __future__ import annotations

import numpy as np


def packed_size(count: int, width: int) -> int:
    return (count * width + 7) // 8


def pack_bits(values: np.ndarray, width: int) -> bytes:
    """values (non-negative ints below 2**width, width <= 64) -> packed_size bytes."""
    count = values.size
    if count == 0 or width == 0:
        return b""
    if width <= 8:
        groups = -(-count // 8)
        v = np.zeros(groups * 8, np.uint64)
        v[:count] = values
        v = v.reshape(groups, 8)
        acc = v[:, 0].copy()
        for j in range(1, 8):
            acc |= v[:, j] << np.uint64(j * width)
        grid = acc.astype("<u8").view(np.uint8).reshape(groups, 8)[:, :width]
        return grid.tobytes()[:packed_size(count, width)]
    values = values.astype(np.uint64, copy=False)
    bitpos = np.arange(count, dtype=np.uint64) * np.uint64(width)
    word = (bitpos >> np.uint64(6)).astype(np.int64)
    off = bitpos & np.uint64(63)
    words = np.zeros(int(word[-1]) + 2, np.uint64)
    # Every 64-bit word where some value starts gets the OR of those values' low parts...
    starts = (np.arange(int(word[-1]) + 1, dtype=np.int64) * 64 + width - 1) // width
    words[word[starts]] = np.bitwise_or.reduceat(values << off, starts)
    # ...and a value that straddles a word boundary spills its high part into the next word.
    spill = np.flatnonzero(off > np.uint64(64 - width))
    words[word[spill] + 1] |= values[spill] >> (np.uint64(64) - off[spill])
    return words.astype("<u8").tobytes()[:packed_size(count, width)]


def unpack_bits(data: bytes | memoryview, count: int, width: int) -> np.ndarray:
    """Inverse of pack_bits: `count` uint64 values; `data` must be packed_size bytes."""
    if len(data) != packed_size(count, width):
        raise ValueError(f"{len(data)} bytes cannot hold {count} values of {width} bits")
    if count == 0 or width == 0:
        return np.zeros(count, np.uint64)
    if width <= 8:
        groups = -(-count // 8)
        grid = np.zeros((groups, 8), np.uint8)
        flat = np.zeros(groups * width, np.uint8)
        flat[:len(data)] = np.frombuffer(data, np.uint8)
        grid[:, :width] = flat.reshape(groups, width)
        acc = grid.view("<u8").reshape(-1)
        out = np.empty((groups, 8), np.uint64)
        mask = np.uint64((1 << width) - 1)
        for j in range(8):
            out[:, j] = (acc >> np.uint64(j * width)) & mask
        return out.reshape(-1)[:count]
    raw = bytes(data) + bytes(16 - len(data) % 8)  # whole words, plus one spare to read past
    words = np.frombuffer(raw, "<u8")
    bitpos = np.arange(count, dtype=np.uint64) * np.uint64(width)
    word = (bitpos >> np.uint64(6)).astype(np.int64)
    off = bitpos & np.uint64(63)
    out = words[word] >> off
    spill = np.flatnonzero(off > np.uint64(64 - width))
    out[spill] |= words[word[spill] + 1] << (np.uint64(64) - off[spill])
    return out & np.uint64((1 << width) - 1) if width < 64 else out
