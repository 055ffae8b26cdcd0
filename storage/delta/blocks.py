"""A large tensor's delta in blocks: independent element ranges, coded and applied on every core.

The publisher and the receiver code one tensor per task of their pool
(storage/weights/parallel.py), so a tensor of a quarter of the model (Qwen2.5-0.5B's embedding:
272 MB of 988) was coded and applied on one thread while the others idled; with 8 cores per
side it set both the publish and the pull (bench/results/transfer_by_time_0.5b_split.json). A
delta of a tensor of at least SPLIT_BYTES is therefore coded as blocks of BLOCK_BYTES, each a
complete payload of its own (header, the encoding chosen for that block, body and result
checksums; payload.py), coded and applied on this module's own threads. Not on the tensor pool:
the caller is one of its tasks, and a task waiting on its own pool's queue can wait forever
behind its own kind. Block tasks wait on nothing.

Body: u32 block count, then per block u64 first element and u64 payload length, then the
payloads in that order. The blocks cover the tensor exactly and in order. Each block's result
is checked against its own checksum when applied, and the table and every block's checksums
are covered by the body checksum: the whole tensor's checksum (the outer header's, which the
weights digest uses) is not computed again by the receiver, and the sender makes it from the
blocks' checksums (content_hash.py), so neither side reads the tensor twice.
"""
from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

from storage.cores import available_cores
from storage.delta import parts

T = TypeVar("T")
R = TypeVar("R")
SPLIT_BYTES = 32 << 20  # tensors from this size up are coded in blocks
BLOCK_BYTES = 8 << 20  # of the tensor's bytes per block: 34 blocks for the 0.5B embedding
_COUNT = struct.Struct("<I")
_ENTRY = struct.Struct("<QQ")

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def splits(nbytes: int) -> bool:
    """Whether a delta of a tensor of `nbytes` is coded in blocks."""
    return nbytes >= SPLIT_BYTES


def ranges(n: int, itemsize: int) -> list[tuple[int, int]]:
    """The blocks' element ranges [start, end) of an n-element tensor."""
    step = max(1, BLOCK_BYTES // itemsize)
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def submit(fn: Callable[[T], R], items: Iterable[T]) -> list[Future]:
    """fn over items on the block threads (one per core this process may use)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(available_cores(), thread_name_prefix="rose-block")
        pool = _pool
    return [pool.submit(fn, item) for item in items]


def gather(futures: list[Future]) -> list:
    """The results in order, once every block is done (none is left writing after an error,
    which is then raised)."""
    wait(futures)
    return [f.result() for f in futures]


def pack(starts: list[int], payloads: list[bytes]) -> bytes:
    """The body: the block table, then the payloads."""
    return b"".join(pack_parts(starts, [[p] for p in payloads]))


def pack_parts(starts: list[int], payloads: list[list]) -> list:
    """`pack`'s body as buffers, each block's payload given as its parts (parts.py)."""
    table = b"".join(_ENTRY.pack(s, parts.nbytes(p)) for s, p in zip(starts, payloads))
    return [_COUNT.pack(len(payloads)) + table, *(b for p in payloads for b in p)]


def unpack(body: memoryview, n: int) -> list[tuple[int, int, memoryview]]:
    """(start, end, payload) per block, checked to cover the n elements in order; ValueError
    when the table is malformed."""
    if len(body) < _COUNT.size:
        raise ValueError("blocks body has no block count")
    (count,) = _COUNT.unpack_from(body)
    at = _COUNT.size + count * _ENTRY.size
    if (count == 0) != (n == 0) or len(body) < at:
        raise ValueError(f"blocks body of {len(body)} bytes cannot hold {count} blocks")
    entries = [_ENTRY.unpack_from(body, _COUNT.size + i * _ENTRY.size) for i in range(count)]
    starts = [s for s, _ in entries] + [n]
    if starts[0] != 0 or any(a >= b for a, b in zip(starts, starts[1:])):
        raise ValueError("blocks do not cover the tensor in order")
    out = []
    for i, (start, length) in enumerate(entries):
        if at + length > len(body):
            raise ValueError(f"block {i} runs past the body")
        out.append((start, starts[i + 1], body[at:at + length]))
        at += length
    if at != len(body):
        raise ValueError(f"{len(body) - at} bytes after the last block")
    return out
