"""A payload as the buffers that make it up, assembled once.

The coders produce a payload in pieces (a header, Elias-Fano's low bits and high part, the
value block's signs and zstd frames; a large tensor's blocks, each such a list). Joining them
at every level copied the coded bytes three or four times while holding the GIL (bytes.join,
bytes +, ndarray.tobytes), which the publish's coding threads then waited for one after
another. Here they are hashed as they are and copied once, by numpy, which releases the GIL
for a copy of any size.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

Buffer = Any  # bytes, bytearray, memoryview, a contiguous ndarray: the buffer protocol

_SMALL = 1 << 12  # bytes: a slice assignment beats numpy's call overhead below this


def _size(part: Buffer) -> int:
    """A piece's bytes, without exporting its buffer (this runs per piece per payload)."""
    return len(part) if isinstance(part, (bytes, bytearray)) else part.nbytes


def nbytes(parts: Sequence[Buffer]) -> int:
    """Total size of `parts`."""
    return sum(_size(p) for p in parts)


def checksum(parts: Sequence[Buffer]) -> int:
    """xxh3_64 of the parts' bytes one after the other (what it is of their join)."""
    if len(parts) == 1:
        return xxhash.xxh3_64_intdigest(parts[0])
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    return h.intdigest()


def assemble(parts: Sequence[Buffer]) -> memoryview:
    """The parts' bytes in one new buffer (a byte view of it)."""
    out = np.empty(nbytes(parts), np.uint8)  # not zeroed: every byte is written
    at = 0
    for p in parts:
        n = _size(p)
        if n >= _SMALL:
            out[at:at + n] = p.reshape(-1).view(np.uint8) if isinstance(p, np.ndarray) \
                else np.frombuffer(p, np.uint8)
        elif n:
            out.data[at:at + n] = memoryview(p).cast("B")
        at += n
    return out.data
