"""Per-tensor encodings over flat unsigned bit-pattern arrays (see bits.py).

  dense     the new bits, raw or as zstd'd byte planes; needs no base (a snapshot)
  xor_zstd  new XOR base, zstd level 1 (slime's scheme); wins where changes cluster
  coo       u64 count, int32 indices, raw new values (the ROSE paper's baseline, 48 bits/change)
  ef        Elias-Fano positions + coded value differences (values.py); the sparse workhorse
  ternary   a 2-bit symbol per element (-1 / same / +1 / escape) + zstd (ternary.py); beats
            Elias-Fano above ~15% density
  blocks    a large tensor's delta as element ranges, each a payload of its own (blocks.py)
Encoders return the body bytes (or, where the body is made of pieces, the list of them:
storage/delta/parts.py assembles the payload once); decoders return a new array and raise ValueError when the body
is malformed. Decoders never write into `base`, except decode_ef when asked to (in place).
"""

from __future__ import annotations

import struct

import numpy as np

from storage.delta import elias_fano, kernels, parts, ternary, values, zstd_io

_LEN = struct.Struct("<Q")
DENSE_RAW, DENSE_ZSTD = 0, 1
COO_MAX_ELEMENTS = 1 << 31  # int32 indices

# Stable on-the-wire ids: never renumber, only append.
ENCODING_IDS = {"dense": 0, "xor_zstd": 1, "coo": 2, "ef": 3, "ternary": 4, "blocks": 5}
ENCODING_NAMES = {i: name for name, i in ENCODING_IDS.items()}
NEEDS_BASE = {"xor_zstd", "coo", "ef", "ternary", "blocks"}


def _planes(u: np.ndarray) -> bytes:
    return np.ascontiguousarray(u.view(np.uint8).reshape(-1, u.itemsize).T).tobytes()


def _unplanes(raw: bytes, n: int, udt: np.dtype) -> np.ndarray:
    grid = np.frombuffer(raw, np.uint8).reshape(udt.itemsize, n)
    return np.array(grid.T, order="C").view(udt).reshape(-1)


def encode_dense(new: np.ndarray, level: int = 0) -> list:
    """Raw bits (level 0), or byte planes + zstd at `level` (exponent bytes compress well),
    as parts: the raw bits are `new` itself, not a copy (parts.py assembles the payload)."""
    if level > 0:
        packed = zstd_io.compress(_planes(new), level)
        if len(packed) < new.nbytes:
            return [bytes([DENSE_ZSTD]), packed]
    return [bytes([DENSE_RAW]), new]


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


def ef_size(count: int, n: int, value_bytes: int) -> int:
    """Exact size of the "ef" body (ef_parts) with `value_bytes` of values.py's value block."""
    return _LEN.size + elias_fano.encoded_size(count, n) + value_bytes


def ef_parts(positions: np.ndarray, n: int, value_parts: list) -> list:
    """The "ef" body, u64 len + Elias-Fano positions then the value block of values.py, as
    the buffers that make it up (storage/delta/parts.py)."""
    pos_parts = elias_fano.encode_parts(positions, n, check=False)  # our own sorted scan
    return [_LEN.pack(parts.nbytes(pos_parts)), *pos_parts, *value_parts]


def decode_ef(body: memoryview, base: np.ndarray, in_place: bool = False) -> np.ndarray:
    if len(body) < _LEN.size:
        raise ValueError("ef body is truncated")
    (pos_len,) = _LEN.unpack_from(body)
    if _LEN.size + pos_len > len(body):
        raise ValueError("ef body is truncated")
    count, universe, low, lows, unary = elias_fano.split(body[_LEN.size:_LEN.size + pos_len])
    if universe != base.size:
        raise ValueError(f"position universe {universe} != element count {base.size}")
    diff = values.decode_values(body[_LEN.size + pos_len:], count, base.dtype)
    # unsigned adds wrap: the inverse of the encoder's new - base
    return kernels.ef_apply(base, lows, unary, count, low, diff, in_place)


encode_ternary = ternary.encode
decode_ternary = ternary.decode
