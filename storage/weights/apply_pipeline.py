"""The receiver's pipeline: bucket k is decoded and applied while the next buckets are fetched.

`pull_into` reads a version whose manifest is already in the relay (so it is complete: the
publisher writes the manifest last). Fetcher threads get buckets from the relay, each verified
against the manifest's checksum as it arrives; the calling thread decodes every bucket as soon
as it is there, in whatever order they arrive, on the decoding pool, into the held weights
(`dest`). A delta is decoded into the held tensor it applies to, in place: no tensor-sized
buffer is allocated (fresh memory is what a pull paid most for: every page of it faults in,
2-20x the cost of the decoding itself on this project's VM, bench/transfer.py). A raw payload
becomes a view on its bucket (no copy at all), put in the dict in place of the old tensor. So
no second copy of the model is built (memory beyond the weights is at most `depth` buckets),
and a caller that needs an earlier version intact while the next one is pulled must copy it
(the co-serving executor's evict-and-reload baseline does).

What is applied is verified: a bucket that fails its checksum (damaged or cut short in the
relay or on the way) is rejected before any of its tensors is touched and fetched again, up to
`retries` times; every payload must decode to the result checksum in its header (storage.delta)
and the shape and dtype the manifest gives. A payload that does not (its body intact, so the
held base was not the sender's) or a bucket that stays bad raises, and what was written before
stays written: `stats["written"]` says whether anything was, so the caller knows its weights
are no longer the version it held (storage/weights/receiver.py then takes a full snapshot).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from storage.delta import read_header
from storage.relay.base import Relay, RelayKeyMissing
from storage.weights.buckets import BucketInfo, CorruptBucket, Manifest, verify_bucket
from storage.weights.digest import tensor_hash
from storage.weights.link_rate import TransferClock
from storage.weights.parallel import ordered_map
from storage.weights.versions import bucket_key
from storage.weights.spans import SpanHashes, SpanTargets, decode_entry, entry_bytes

_POLL_S = 0.05  # how often a blocked fetcher looks whether the pull was abandoned


def fits(manifest: Manifest, tensors: dict[str, torch.Tensor] | None) -> bool:
    """True when `tensors` has exactly the manifest's names, shapes and dtypes (so the version
    can be applied into them)."""
    if tensors is None:
        return False
    want = {e.name: e.meta for _, e in manifest.entries()}
    return want.keys() == tensors.keys() and all(
        list(tensors[n].shape) == list(m.get("shape", [])) and
        str(tensors[n].dtype).removeprefix("torch.") == m.get("dtype") for n, m in want.items())


class _Fetcher:
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


class BucketApplier:
    """Decodes verified buckets into `dest` (a new dict when None): deltas onto `base` (in
    place when `base is dest`), raw payloads as views on their bucket. Each delta's result
    checksum is kept as its tensor's hash (for the weights digest). `stats` as pull_into's."""

    def __init__(self, dest: dict[str, torch.Tensor] | None, base: dict[str, torch.Tensor] | None,
                 base_version: int | None, workers: int, stats: dict[str, Any]) -> None:
        self.out: dict[str, torch.Tensor] = {} if dest is None else dest
        self.touches_dest = dest is not None
        self.base, self.base_version, self.workers, self.st = base, base_version, workers, stats
        self.in_place = dest is not None and base is dest  # a delta onto the held weights
        for key, zero in (("bytes", 0), ("buckets", 0), ("fetch_s", 0.0), ("apply_s", 0.0),
                          ("wait_s", 0.0), ("rejected", 0), ("applied", 0), ("written", False)):
            stats.setdefault(key, zero)
        stats.setdefault("order", [])
        stats.setdefault("hashes", {})
        self.spans = stats.setdefault("span_hashes", SpanHashes())  # shared with a later pull
        self.targets = SpanTargets(self.out, self.in_place)

    def _decode(self, item: tuple[memoryview, Any]) -> torch.Tensor:
        view, entry = item
        payload = view[entry.offset:entry.offset + entry.length]
        tensor = decode_entry(entry.name, payload, entry.meta, self.base, self.base_version,
                              self.targets, self.spans, entry.checksum, self.in_place)
        if "span" in entry.meta:  # its hash went into self.spans
            return tensor
        # a delta's result checksum was just verified against what it decoded to; a raw
        # payload's entry checksum is its tensor's hash, and its bucket was verified
        encoding = entry.meta.get("encoding")
        self.st["hashes"][entry.name] = read_header(payload).result_checksum \
            if encoding == "rsdt" else int(entry.checksum, 16) if encoding == "raw" \
            else tensor_hash(tensor)
        return tensor

    def apply(self, info: BucketInfo, view: memoryview) -> None:
        """Decode bucket `info` (verified `view`) into the destination."""
        t = time.perf_counter()
        self.st["written"] |= self.in_place  # decoding deltas writes into `dest` as it goes
        decoded = list(ordered_map(self._decode, [(view, e) for e in info.entries], self.workers,
                                   lambda item: entry_bytes(item[1].meta)))
        if self.touches_dest:
            self.st["written"] = True  # from here on `dest` is no longer what it was
        for entry, tensor in zip(info.entries, decoded):
            # decoded empties may carry odd strides: normalize
            self.out[entry.name] = tensor if tensor.numel() else torch.empty(tensor.shape,
                                                                             dtype=tensor.dtype)
        self.st["applied"] += 1
        self.st["order"].append(info.index)
        self.st["apply_s"] += time.perf_counter() - t


def pull_into(relay: Relay, run: str, version: int, manifest: Manifest,
              dest: dict[str, torch.Tensor] | None, base: dict[str, torch.Tensor] | None = None,
              base_version: int | None = None, *, part: str = "", workers: int = 1,
              fetchers: int = 2, depth: int = 3, retries: int = 2, skip: int = 0,
              stats: dict[str, Any] | None = None,
              read: dict[int, memoryview] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of `version` (described by `manifest`): `dest` itself when given (it must
    `fit` the manifest; its tensors are replaced bucket by bucket), else a new dict (raw
    payloads as views on the buckets either way). `base` /
    `base_version`: what deltas apply onto. `skip`: the first buckets are already applied
    (streamed before the manifest, storage/weights/stream_pull.py). `stats` receives (adding
    to what it holds) bytes, buckets, fetch_s (fetcher threads' seconds), apply_s, wait_s
    (waiting for a bucket), rejected, applied (buckets), written (whether `dest` was touched
    at all), order (bucket indices as applied), hashes (per tensor applied, its
    tensor_hash: a delta's verified result checksum, for the digest) and gets (a
    TransferClock of the relay gets alone: storage/weights/link_rate.py). `read`: buckets read
    already, by index (storage/weights/first_read.py), each checked as a fetched one is."""
    if dest is not None and not fits(manifest, dest):
        raise CorruptBucket(f"v{version}: its tensors' names, shapes or dtypes differ from "
                            "the weights it would be applied into")
    st: dict[str, Any] = stats if stats is not None else {}
    applier = BucketApplier(dest, base, base_version, workers, st)
    rest = manifest.buckets[skip:]
    st["bytes"] += sum(b.nbytes for b in rest)
    st["buckets"] += len(rest)
    keys = [bucket_key(run, version, b.index, part) for b in rest]
    fetcher = _Fetcher(relay, keys, rest, fetchers, depth, retries,
                       st.setdefault("gets", TransferClock()), read)
    try:
        t = time.perf_counter()
        for i, view in fetcher.arrivals():
            st["wait_s"] += time.perf_counter() - t
            applier.apply(rest[i], view)
            t = time.perf_counter()
    finally:
        fetcher.close()
        st["fetch_s"] += fetcher.fetch_s
        st["rejected"] += fetcher.rejected
        st["bytes"] += fetcher.rejected_bytes
    st["hashes"].update(applier.spans.tensors())  # every span is in: each tensor's hash
    return applier.out
