"""The sender's pipeline: bucket k is put into the relay while bucket k+1 is encoded and packed.

A `BucketPusher` owns one thread that does the relay puts, fed by a queue: the publishing
thread (which drives the encoding pool and packs buckets) hands each bucket over and goes on
with the next one. Memory stays bounded: at most `depth` buckets are handed over and not yet
pushed (one being put, the rest queued); a full queue makes the publisher wait, so a slow link
throttles encoding instead of letting finished buckets pile up.

`first` (a callable) runs on that thread before any put: the relay work a publish must finish
before its first bucket goes in (pruning old versions, clearing the version's prefix, the
announce), done while the publisher encodes and packs that bucket instead of before it.

`close()` returns only once every bucket handed over is in the relay, and raises the first put
error; that is what lets the publisher write the manifest strictly after all buckets (the
version becomes visible only when complete). `abort()` (on an encoding error) drops what is
queued and waits for the put under way, so nothing is written behind the caller's back after
it returns.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from storage.relay.base import Buffer, Relay
from storage.weights.link_rate import TransferClock

_STOP = object()


class BucketPusher:
    """Puts (key, bucket) pairs into `relay` from a thread of its own, in the order given."""

    def __init__(self, relay: Relay, depth: int = 2,
                 first: Callable[[], None] | None = None) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.relay = relay
        # the put under way holds one bucket; the queue the rest of `depth`
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth - 1))
        self._error: BaseException | None = None
        self._aborted = threading.Event()
        self.put_s = 0.0  # seconds inside relay.put (the relay's own time, pacing included)
        self.wait_s = 0.0  # seconds the publisher waited for room (the link was the limit)
        self.puts = TransferClock()  # the bucket puts alone: what the link's put leg did
        self.pushed = 0
        self._first = first
        self._thread = threading.Thread(target=self._run, name="rose-push", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._first is not None:
            try:
                self._first()
            except BaseException as e:  # no bucket goes in after it: handed over as a put's
                self._error = e
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None or self._aborted.is_set():
                continue  # drain: the publish failed, nothing more goes out
            key, blob, after = item
            t = time.perf_counter()
            try:
                self.relay.put(key, blob)
                self.puts.add(memoryview(blob).nbytes, t, time.perf_counter())
                self.pushed += 1
                if after is not None:  # what says the bucket is there (stream_pull.py)
                    self.relay.put(*after)
            except BaseException as e:  # handed to the publisher by put()/close()
                self._error = e
            self.put_s += time.perf_counter() - t

    def put(self, key: str, blob: Buffer, after: tuple[str, Buffer] | None = None) -> None:
        """Hand a bucket over (and a small `after` (key, value) put right behind it); waits
        while `depth` buckets are already in flight. Raises the error of an earlier put at
        once (no point encoding more)."""
        self._raise()
        t = time.perf_counter()
        self._queue.put((key, blob, after))
        self.wait_s += time.perf_counter() - t

    def close(self) -> None:
        """Wait until every bucket handed over is in the relay; raise the first put error."""
        self._queue.put(_STOP)
        self._thread.join()
        self._raise()

    def abort(self) -> None:
        """Drop the queued buckets and wait for the put under way (idempotent)."""
        self._aborted.set()
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
