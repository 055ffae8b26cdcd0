"""The self-describing header in front of every encoded tensor.

Layout (little-endian): magic "RSDT", format, encoding, dtype code, ndim, base version (-1 =
none), target version, element count, body length, the content hash of the RESULT tensor's
bytes (content_hash.py), xxh3-64 of the body, name length, shape (ndim u64), name (utf-8), then
xxh32 of all header bytes before it.
The header checksum makes any flipped header bit a CorruptPayload rather than a misread field.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch
import xxhash

from storage.delta.bits import DTYPE_CODES, DTYPES_BY_CODE
from storage.delta.encodings import ENCODING_IDS, ENCODING_NAMES
from storage.delta.errors import CorruptPayload

MAGIC = b"RSDT"
FORMAT_VERSION = 1
_FIXED = struct.Struct("<4sBBBBqqQQQQH")
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class DeltaHeader:
    name: str
    encoding: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    numel: int
    base_version: int | None
    target_version: int
    result_checksum: int
    body_checksum: int
    body_length: int
    header_length: int = 0

    def __post_init__(self) -> None:
        if self.encoding not in ENCODING_IDS:
            raise ValueError(f"unknown encoding {self.encoding!r}")
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"unsupported dtype {self.dtype}")
        if math.prod(self.shape) != self.numel or any(d < 0 for d in self.shape):
            raise ValueError(f"shape {self.shape} does not hold {self.numel} elements")
        if self.base_version is not None and self.base_version < 0:
            raise ValueError(f"base version must be >= 0, got {self.base_version}")
        if self.target_version < 0:
            raise ValueError(f"target version must be >= 0, got {self.target_version}")
        if len(self.name.encode()) > 0xFFFF:
            raise ValueError("tensor name longer than 65535 bytes")

    def pack(self) -> bytes:
        name = self.name.encode()
        base = -1 if self.base_version is None else self.base_version
        head = _FIXED.pack(MAGIC, FORMAT_VERSION, ENCODING_IDS[self.encoding],
                           DTYPE_CODES[self.dtype], len(self.shape), base, self.target_version,
                           self.numel, self.body_length, self.result_checksum,
                           self.body_checksum, len(name))
        head += struct.pack(f"<{len(self.shape)}Q", *self.shape) + name
        return head + _CRC.pack(xxhash.xxh32_intdigest(head))


def unpack_header(payload: bytes | memoryview) -> DeltaHeader:
    """Parse and verify the header; CorruptPayload with the reason if anything is off."""
    buf = memoryview(payload)
    if len(buf) < _FIXED.size:
        raise CorruptPayload(f"payload of {len(buf)} bytes is shorter than a delta header")
    (magic, fmt, enc, dtype_code, ndim, base, target, numel, body_len, result_sum, body_sum,
     name_len) = _FIXED.unpack_from(buf)
    if magic != MAGIC:
        raise CorruptPayload(f"not a delta payload (magic {bytes(magic)!r})")
    if fmt != FORMAT_VERSION:
        raise CorruptPayload(f"delta format version {fmt} is not supported (this reader: 1)")
    end = _FIXED.size + 8 * ndim + name_len
    if len(buf) < end + _CRC.size:
        raise CorruptPayload("payload is truncated inside its header")
    (crc,) = _CRC.unpack_from(buf, end)
    if crc != xxhash.xxh32_intdigest(buf[:end]):
        raise CorruptPayload("delta header checksum mismatch")
    if enc not in ENCODING_NAMES:
        raise CorruptPayload(f"unknown delta encoding id {enc}")
    if dtype_code not in DTYPES_BY_CODE:
        raise CorruptPayload(f"unknown dtype code {dtype_code}")
    try:
        shape = struct.unpack_from(f"<{ndim}Q", buf, _FIXED.size)
        name = bytes(buf[_FIXED.size + 8 * ndim:end]).decode()
        return DeltaHeader(
            name=name, encoding=ENCODING_NAMES[enc], dtype=DTYPES_BY_CODE[dtype_code],
            shape=tuple(shape),
            numel=numel, base_version=None if base == -1 else base, target_version=target,
            result_checksum=result_sum, body_checksum=body_sum, body_length=body_len,
            header_length=end + _CRC.size)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptPayload(f"bad delta header: {exc}") from exc
