"""Fetching a version's buckets for the receiver's pipeline (storage/weights/apply_pipeline.py).

Fetcher threads get buckets from the relay, each verified against the manifest's checksum as
it arrives, at most `depth` ahead of the consumer (memory beyond the weights is at most that
many buckets); a bucket that fails its checksum (damaged or cut short in the relay or on the
way) is rejected whole and fetched again, up to `retries` times.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from storage.relay.base import Relay, RelayKeyMissing
from storage.weights.buckets import BucketInfo, CorruptBucket, verify_bucket
from storage.weights.link_rate import TransferClock

_POLL_S = 0.05  # how often a blocked fetcher looks whether the pull was abandoned


class BucketFetcher:
    """Fetcher threads: bucket indices in, (index, verified view | error) out; at most `depth`
    buckets taken and not yet released by the consumer; `gets` times the relay gets alone."""

    def __init__(self, relay: Relay, keys: list[str], infos: list[BucketInfo], threads: int,
                 depth: int, retries: int, gets: TransferClock,
                 read: dict[int, memoryview] | None = None) -> None:
        self.relay, self.keys, self.infos, self.retries = relay, keys, infos, retries
        self.gets = gets
        self.read = dict(read or {})  # bucket index -> a copy read already (first_read.py)
        self.out: queue.Queue = queue.Queue()
        self.tokens = threading.Semaphore(depth)
        self.stop = threading.Event()
        self._next = iter(range(len(keys)))
        self._lock = threading.Lock()
        self.fetch_s, self.rejected, self.rejected_bytes = 0.0, 0, 0
        # one bucket (a small model): fetched inline, nothing to overlap and no thread to start
        self.inline = len(keys) == 1
        self.threads = [] if self.inline else [
            threading.Thread(target=self._run, daemon=True, name="rose-fetch")
            for _ in range(max(1, min(threads, len(keys))))]
        for t in self.threads:
            t.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            while not self.tokens.acquire(timeout=_POLL_S):
                if self.stop.is_set():
                    return
            with self._lock:
                i = next(self._next, None)
            if i is None or self.stop.is_set():
                self.tokens.release()
                return
            self.out.put(self._fetch(i))

    def _fetch(self, i: int) -> tuple[int, Any]:
        t = time.perf_counter()
        try:
            for attempt in range(self.retries + 1):
                start = time.perf_counter()
                with self._lock:
                    blob = self.read.pop(self.infos[i].index, None)
                if blob is None:
                    blob = self.relay.get_many([self.keys[i]])[0]
                    self.gets.add(memoryview(blob).nbytes, start, time.perf_counter())
                try:
                    return i, verify_bucket(self.infos[i], blob, self.keys[i])
                except CorruptBucket as e:  # rejected whole; fetched again (a torn read heals)
                    with self._lock:
                        self.rejected += 1
                        self.rejected_bytes += memoryview(blob).nbytes
                    if attempt == self.retries:
                        return i, CorruptBucket(f"{e} (rejected {self.retries + 1} times)")
        except RelayKeyMissing as e:
            return i, RelayKeyMissing(f"incomplete: {e}")
        except Exception as e:  # a relay error: the consumer raises it
            return i, e
        finally:
            with self._lock:
                self.fetch_s += time.perf_counter() - t
        raise AssertionError("unreachable")

    def arrivals(self) -> Iterator[tuple[int, memoryview]]:
        for _ in self.keys:
            i, got = self._fetch(0) if self.inline else self.out.get()
            if isinstance(got, BaseException):
                raise got
            yield i, got
            self.tokens.release()  # the bucket is applied: room for the next fetch

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
