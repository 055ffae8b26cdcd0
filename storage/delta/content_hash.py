"""A tensor's content hash: a payload's result checksum, a raw bucket entry's checksum and the
weights digest's per-tensor hash (storage/weights/digest.py) are all this one value.

Below blocks.SPLIT_BYTES it is xxh3-64 of the bytes. From SPLIT_BYTES up it is xxh3-64 of the
xxh3-64s of the bytes' BLOCK_BYTES blocks (8 bytes each, little-endian, in order): the blocks
a delta of such a tensor is coded in (blocks.py), each of which carries its own block's xxh3-64
as its result checksum. So the publisher has the whole tensor's hash from its blocks' instead of
from a second pass over the tensor's bits: it used to read every large tensor twice per
publish, and in a 7B model nearly every tensor is that large.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

from storage.delta import blocks
from storage.delta.parts import Buffer


def _byte_view(data: Buffer) -> memoryview:
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def combine(block_hashes: Sequence[int]) -> int:
    """The content hash of a blocked buffer from its blocks' xxh3-64s, in order."""
    return xxhash.xxh3_64_intdigest(np.asarray(block_hashes, "<u8").tobytes())


def composes(itemsize: int) -> bool:
    """Whether the result checksums of a blocked payload's blocks (blocks.ranges over elements
    of `itemsize`) make its content hash: they fall on the hash's byte blocks and each is hashed
    plainly (always with the real sizes; a test's odd sizes may not)."""
    return blocks.BLOCK_BYTES % itemsize == 0 and not blocks.splits(blocks.BLOCK_BYTES)


def content_hash(data: Buffer) -> int:
    """The content hash of a contiguous buffer (a tensor's bits, or a raw payload's bytes)."""
    view = _byte_view(data)
    if not blocks.splits(view.nbytes):  # the coder's split, so a delta's blocks compose it
        return xxhash.xxh3_64_intdigest(view)
    return combine([xxhash.xxh3_64_intdigest(view[a:b])
                    for a, b in blocks.ranges(view.nbytes, 1)])
