"""Encode and decode tensors on every core: an ordered, bounded map over a shared thread pool.

Threads, not processes: the codec's kernels are vectorised numpy, zstd and xxhash, which
release the GIL for most of their work, so threads scale without pickling tensors to another
process: on this project's 2-core machine two threads encode 1.4-1.9x as fast as one
(bench/transfer/transfer_calibrate.py). The per-element passes are numba kernels that release the GIL
(storage/delta/kernels.py, chosen over numpy by bench/transfer/codec_scan.py); applying is memory-bound
(its base copy and result checksum), so a second thread gains it little on this machine.

Small tensors are grouped into tasks of at least `chunk_bytes`, since a task's hand-off
(~20 us) would otherwise dominate them, and a model that fits in one task is coded inline; at
most `window` tasks run ahead of the consumer, which bounds the memory held by results.
"""
from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
CHUNK_BYTES = 4 << 20
AHEAD_BYTES = 256 << 20  # work the threads may run ahead of a slow task at the head

_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def busy_workers(total_cost: int, workers: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """How many of `workers` threads ordered_map keeps busy on work costing `total_cost`: one
    per task of chunk_bytes at most (a model that fits in one task is coded inline)."""
    return max(1, min(workers, -(-total_cost // chunk_bytes)))


def _pool(workers: int) -> ThreadPoolExecutor:
    with _lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="rose-codec")
        return pool


def _chunks(items: Iterable[T], cost: Callable[[T], int],
            chunk_bytes: int) -> Iterator[tuple[list[T], int]]:
    chunk, size = [], 0
    for item in items:
        item_cost = cost(item)
        if chunk and item_cost >= chunk_bytes:  # a large item is a task of its own: the small
            yield chunk, size                   # ones before it are not held back by it
            chunk, size = [], 0
        chunk.append(item)
        size += item_cost
        if size >= chunk_bytes:
            yield chunk, size
            chunk, size = [], 0
    if chunk:
        yield chunk, size


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int,
                cost: Callable[[T], int] = lambda _: CHUNK_BYTES,
                chunk_bytes: int = CHUNK_BYTES, window: int | None = None,
                ahead_bytes: int = AHEAD_BYTES) -> Iterator[R]:
    """fn over items, results in the items' order, computed by `workers` threads (inline when
    workers <= 1). An exception is raised where its item's result would be, after the tasks
    already started have finished (none is left running on shared state).

    At most `window` tasks (default 2 per thread) run ahead of the consumer, or more while the
    work queued behind the oldest one costs under `ahead_bytes`: one large tensor at the head
    (an embedding of a quarter of the model) must not leave the other threads idle until it is
    done. What is held meanwhile is the results of at most that much work."""
    if workers <= 1:
        yield from map(fn, items)
        return
    chunks = _chunks(items, cost, chunk_bytes)
    first = next(chunks, ([], 0))
    second = next(chunks, None)
    if second is None:  # one task's worth in all (a tiny model): the hand-off would only cost
        yield from map(fn, first[0])
        return
    pool, window = _pool(workers), window or 2 * workers
    pending: deque[tuple[Future, int]] = deque()
    behind = 0  # cost of the tasks queued behind the oldest one
    run = lambda chunk: [fn(item) for item in chunk]  # noqa: E731
    try:
        for chunk, size in itertools.chain([first, second], chunks):
            pending.append((pool.submit(run, chunk), size))
            behind += size if len(pending) > 1 else 0
            while len(pending) >= window and (behind >= ahead_bytes or pending[0][0].done()):
                yield from pending.popleft()[0].result()
                behind -= pending[0][1] if pending else 0
        while pending:
            yield from pending.popleft()[0].result()
    finally:  # an error or an abandoned iterator: nothing runs on after we return
        for future, _ in pending:
            future.cancel()
        for future, _ in pending:
            if not future.cancelled():
                future.exception()
