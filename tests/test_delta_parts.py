"""A payload's pieces hashed as they are and assembled once (storage/delta/parts.py)."""
from __future__ import annotations

import numpy as np
import xxhash

from storage.delta import parts


def _pieces() -> list:
    rng = np.random.default_rng(0)
    return [b"head", rng.integers(0, 1 << 16, 5000, dtype=np.uint16), memoryview(b"xyz"), b"",
            np.zeros(0, np.uint8), rng.integers(0, 255, 1 << 13, dtype=np.uint8)[::1], b"tail"]


def test_assemble_is_the_join_of_the_pieces():
    pieces = _pieces()
    joined = b"".join(bytes(memoryview(p).cast("B")) for p in pieces)
    out = parts.assemble(pieces)
    assert bytes(out) == joined and out.nbytes == parts.nbytes(pieces) == len(joined)
    pieces[1][0] ^= 1  # a copy: the pieces may be reused once assembled
    assert bytes(out) == joined
    assert bytes(parts.assemble([])) == b""


def test_checksum_is_that_of_the_join():
    pieces = _pieces()
    joined = b"".join(bytes(memoryview(p).cast("B")) for p in pieces)
    assert parts.checksum(pieces) == xxhash.xxh3_64_intdigest(joined)
    assert parts.checksum([pieces[1]]) == xxhash.xxh3_64_intdigest(pieces[1].tobytes())
    assert parts.checksum([]) == xxhash.xxh3_64_intdigest(b"")
