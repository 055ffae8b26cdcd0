"""Per-tensor encodings over flat unsigned bit-pattern arrays (see bits.py).

  dense     the new bits, raw or as zstd'd byte planes; needs no base (a snapshot)
  xor_zstd  new XOR base, zstd level 1 (slime's scheme); wins where changes cluster
  coo       u64 count, int32 indices, raw new values (the ROSE paper's baseline, 48 bits/change)
  ef        Elias-Fano positions + coded value differences (values.py)
  bitmap    one bit per element + coded value differences; beats Elias-Fano above ~30% density
Encoders return the body bytes; decoders return a new array and raise ValueError when the body
is malformed. Decoders never write into `base`.
"""

from __future__ import annotations

import struct

import numpy as np

from storage.delta import elias_fano, values, zstd_io

_LEN = struct.Struct("<Q")
DENSE_RAW, DENSE_ZSTD = 0, 1
COO_MAX_ELEMENTS = 1 << 31  # int32 indices
_BITMAP_CHUNK = 1 << 18     # elements per step when expanding a bitmap (stays in cache)

# Stable on-the-wire ids: never renumber, only append.
ENCODING_IDS = {"dense": 0, "xor_zstd": 1, "coo": 2, "ef": 3, "bitmap": 4}
ENCODING_NAMES = {i: name for name, i in ENCODING_IDS.items()}
NEEDS_BASE = {"xor_zstd", "coo", "ef", "bitmap"}


def _planes(u: np.ndarray) -> bytes:
    return np.ascontiguousarray(u.view(np.uint8).reshape(-1, u.itemsize).T).tobytes()


def _unplanes(raw: bytes, n: int, udt: np.dtype) -> np.ndarray:
    grid = np.frombuffer(raw, np.uint8).reshape(udt.itemsize, n)
    return np.array(grid.T, order="C").view(udt).reshape(-1)


def encode_dense(new: np.ndarray, level: int = 0) -> bytes:
    """Raw bits (level 0), or byte planes + zstd at `level` (exponent bytes compress well)."""
    if level > 0:
        packed = zstd_io.compress(_planes(new), level)
        if len(packed) < new.nbytes:
            return bytes([DENSE_ZSTD]) + packed
    return bytes([DENSE_RAW]) + new.tobytes()


def decode_dense(body: memoryview, n: int, udt: np.dtype) -> np.ndarray:
    if len(body) < 1 or body[0] not in (DENSE_RAW, DENSE_ZSTD):
        raise ValueError("dense body has no valid mode byte")
    if body[0] == DENSE_RAW:
        if len(body) - 1 != n * udt.itemsize:
            raise ValueError(f"dense body holds {len(body) - 1} bytes, expected {n * udt.itemsize}")
        return np.frombuffer(body, udt, n, 1).copy()
    return _unplanes(zstd_io.decompress(body[1:], n * udt.itemsize), n, udt)


def encode_xor_zstd(new: np.ndarray, base: np.ndarray, level: int = 1) -> bytes:
    return zstd_io.compress(np.bitwise_xor(new, base), level)


def decode_xor_zstd(body: memoryview, base: np.ndarray) -> np.ndarray:
    raw = zstd_io.decompress(body, base.nbytes)
    return np.bitwise_xor(np.frombuffer(raw, base.dtype), base)


def coo_size(count: int, n: int, itemsize: int) -> int | None:
    """Exact body size of `encode_coo`, or None when int32 cannot index n elements."""
    return _LEN.size + count * (4 + itemsize) if n <= COO_MAX_ELEMENTS else None


def encode_coo(positions: np.ndarray, new: np.ndarray) -> bytes:
    if new.size > COO_MAX_ELEMENTS:
        raise ValueError(f"coo indexes at most 2**31 elements, tensor has {new.size}")
    return b"".join([_LEN.pack(positions.size), positions.astype("<i4").tobytes(),
                     new[positions].tobytes()])


def decode_coo(body: memoryview, base: np.ndarray) -> np.ndarray:
    if len(body) < _LEN.size:
        raise ValueError("coo body is truncated")
    (count,) = _LEN.unpack_from(body)
    if len(body) != _LEN.size + count * (4 + base.itemsize):
        raise ValueError(f"coo body is {len(body)} bytes, {count} changes need "
                         f"{_LEN.size + count * (4 + base.itemsize)}")
    index = np.frombuffer(body, "<i4", count, _LEN.size)
    if count and (index.min() < 0 or index.max() >= base.size):
        raise ValueError("coo index out of range")
    out = base.copy()
    out[index] = np.frombuffer(body, base.dtype, count, _LEN.size + 4 * count)
    return out


def bitmap_size(n: int) -> int:
    return (n + 7) // 8


def encode_positions(kind: str, positions: np.ndarray, n: int,
                     bitmap: np.ndarray | None = None) -> bytes:
    """Elias-Fano or bitmap bytes of `positions` (`bitmap`: packbits of the mask, if known)."""
    if kind == "ef":
        return elias_fano.encode(positions, n, check=False)  # our own sorted scan
    if bitmap is not None:
        return bitmap.tobytes()
    mask = np.zeros(n, np.uint8)
    mask[positions] = 1
    return np.packbits(mask, bitorder="little").tobytes()


def decode_positions(kind: str, blob: memoryview, n: int) -> np.ndarray:
    if kind == "ef":
        positions, universe = elias_fano.decode(blob)
        if universe != n:
            raise ValueError(f"position universe {universe} != element count {n}")
        return positions
    if len(blob) != bitmap_size(n):
        raise ValueError(f"bitmap is {len(blob)} bytes, expected {bitmap_size(n)}")
    packed = np.frombuffer(blob, np.uint8)
    step = _BITMAP_CHUNK // 8
    found = [np.flatnonzero(np.unpackbits(packed[i:i + step], count=min(_BITMAP_CHUNK, n - 8 * i),
                                          bitorder="little").view(bool)) + 8 * i
             for i in range(0, packed.size, step)]
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def positions_size(kind: str, count: int, n: int) -> int:
    return elias_fano.encoded_size(count, n) if kind == "ef" else bitmap_size(n)


def encode_sparse(kind: str, positions: np.ndarray, n: int, value_blob: bytes,
                  bitmap: np.ndarray | None = None) -> bytes:
    """Body of `ef` / `bitmap`: u64 len + positions, then the value block of values.py."""
    pos_blob = encode_positions(kind, positions, n, bitmap)
    return b"".join([_LEN.pack(len(pos_blob)), pos_blob, value_blob])


def decode_sparse(kind: str, body: memoryview, base: np.ndarray) -> np.ndarray:
    if len(body) < _LEN.size:
        raise ValueError(f"{kind} body is truncated")
    (pos_len,) = _LEN.unpack_from(body)
    if _LEN.size + pos_len > len(body):
        raise ValueError(f"{kind} body is truncated")
    positions = decode_positions(kind, body[_LEN.size:_LEN.size + pos_len], base.size)
    diff = values.decode_values(body[_LEN.size + pos_len:], positions.size, base.dtype)
    out = base.copy()
    out[positions] += diff  # unsigned: wraps, the inverse of the encoder's new - base
    return out
