"""The receiver's pipeline, the one way every receiver takes a version in (`pull_into`), in
three modes:
  PIPELINED  bucket k is decoded and applied while the next buckets are fetched (below);
  STREAMED   a delta still being published: its buckets applied as they land, before the
             manifest (storage/weights/stream_pull.py), the rest then PIPELINED;
  WHOLE      every bucket fetched and verified before any is decoded, into new tensors: a
             failure leaves what is held untouched, at twice the memory (`pull_weights`).

PIPELINED reads a version whose manifest is already in the relay (so it is complete: the
publisher writes the manifest last). Fetcher threads get buckets from the relay, each verified
against the manifest's checksum as it arrives (storage/weights/bucket_fetch.py); the calling
thread decodes every bucket as soon as it is there, in whatever order they arrive, on the
decoding pool, into the held weights (`dest`). A delta is decoded into the held tensor it
applies to, in place: no tensor-sized buffer is allocated (fresh memory is what a pull paid
most for: every page of it faults in, 2-20x the cost of the decoding itself on this project's
VM, bench/transfer/transfer.py). A raw payload becomes a view on its bucket (no copy at all), put in the
dict in place of the old tensor. So no second copy of the model is built (memory beyond the
weights is at most `depth` buckets), and a caller that needs an earlier version intact while
the next one is pulled must copy it (the co-serving executor's evict-and-reload baseline does).

What is applied is verified: a bucket that fails its checksum (damaged or cut short in the
relay or on the way) is rejected before any of its tensors is touched and fetched again, up to
`retries` times; every payload must decode to the result checksum in its header (storage.delta)
and the shape and dtype the manifest gives. A payload that does not (its body intact, so the
held base was not the sender's) or a bucket that stays bad raises, and what was written before
stays written: `stats["written"]` says whether anything was, so the caller knows its weights
are no longer the version it held (storage/weights/receiver.py then takes a full snapshot).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from storage.delta import read_header
from storage.relay.base import Relay, RelayKeyMissing
from storage.weights.bucket_fetch import BucketFetcher
from storage.weights.buckets import BucketInfo, CorruptBucket, Manifest, batches, verify_bucket
from storage.weights.digest import tensor_hash
from storage.weights.link_rate import TransferClock
from storage.weights.parallel import ordered_map
from storage.weights.payloads import shape_bytes
from storage.weights.spans import SpanHashes, SpanTargets, decode_entry, entry_bytes
from storage.weights.stream_pull import follow_stream
from storage.weights.versions import bucket_key, latest_version, read_manifest

# How a version is received (pull_into `mode`; see the module docstring)
PIPELINED, WHOLE, STREAMED = "pipelined", "whole", "streamed"
MODES = (PIPELINED, WHOLE, STREAMED)


def fits(manifest: Manifest, tensors: dict[str, torch.Tensor] | None) -> bool:
    """True when `tensors` has exactly the manifest's names, shapes and dtypes (so the version
    can be applied into them)."""
    if tensors is None:
        return False
    want = {e.name: e.meta for _, e in manifest.entries()}
    return want.keys() == tensors.keys() and all(
        list(tensors[n].shape) == list(m.get("shape", [])) and
        str(tensors[n].dtype).removeprefix("torch.") == m.get("dtype") for n, m in want.items())


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
        self.apply_all([(info, view)], lambda item: entry_bytes(item[1].meta))

    def apply_all(self, buckets: list[tuple[BucketInfo, memoryview]],
                  cost: Callable[[tuple[memoryview, Any]], int]) -> None:
        """Decode `buckets` (each verified) into the destination, their entries spread over
        the decoding threads by `cost`."""
        t = time.perf_counter()
        self.st["written"] |= self.in_place  # decoding deltas writes into `dest` as it goes
        items = [(view, e) for info, view in buckets for e in info.entries]
        decoded = list(ordered_map(self._decode, items, self.workers, cost))
        if self.touches_dest:
            self.st["written"] = True  # from here on `dest` is no longer what it was
        for (_, entry), tensor in zip(items, decoded):
            # decoded empties may carry odd strides: normalize
            self.out[entry.name] = tensor if tensor.numel() else torch.empty(tensor.shape,
                                                                             dtype=tensor.dtype)
        self.st["applied"] += len(buckets)
        self.st["order"] += [info.index for info, _ in buckets]
        self.st["apply_s"] += time.perf_counter() - t


def pull_into(relay: Relay, run: str, version: int, manifest: Manifest | None,
              dest: dict[str, torch.Tensor] | None, base: dict[str, torch.Tensor] | None = None,
              base_version: int | None = None, *, mode: str = PIPELINED,
              announced: dict[str, Any] | None = None, part: str = "", workers: int = 1,
              fetchers: int = 2, depth: int = 3, retries: int = 2, batch_bytes: int = 1 << 30,
              timeout_s: float = 60.0, stats: dict[str, Any] | None = None,
              read: dict[int, memoryview] | None = None
              ) -> tuple[Manifest, dict[str, torch.Tensor]]:
    """(manifest, the tensors of `version`): `dest` itself when given (it must `fit` the
    manifest; its tensors are replaced bucket by bucket), else a new dict (raw payloads as
    views on the buckets either way). `base` / `base_version`: what deltas apply onto.
    `mode` (see the module docstring): PIPELINED, WHOLE (`dest` None; `batch_bytes` a
    get), or STREAMED (`announced`, what storage/weights/stream_pull.await_published
    returned; no `manifest` yet; `dest` and `base` the held weights; a publish quiet for
    `timeout_s` is given up). `stats` receives (adding to what it holds) bytes, buckets,
    fetch_s (fetcher threads' seconds), apply_s, wait_s (waiting for a bucket), rejected,
    applied (buckets), written (whether `dest` was touched at all), order (bucket indices as
    applied), hashes (per tensor applied, its tensor_hash: a delta's verified result
    checksum, for the digest) and gets (a TransferClock of the relay gets alone:
    storage/weights/link_rate.py); streamed, also stream_pull.follow_stream's. `read`:
    buckets read already, by index (storage/weights/first_read.py; not WHOLE), each checked as a
    fetched one is."""
    if mode not in MODES or (mode == STREAMED) != (announced is not None) \
            or (mode == STREAMED) == (manifest is not None) or (mode == WHOLE and dest is not None):
        raise ValueError(f"pull mode {mode!r}: announced (only streamed), a manifest (all "
                         "others) and no dest (whole) are what it takes")
    st: dict[str, Any] = stats if stats is not None else {}
    applier = BucketApplier(dest, base, base_version, workers, st)
    skip = 0
    if announced is not None:  # the first buckets as they are published, then the rest
        manifest, skip = follow_stream(relay, run, version, announced, applier.apply, st,
                                       timeout_s, retries)
    assert manifest is not None
    if dest is not None and not fits(manifest, dest):
        raise CorruptBucket(f"v{version}: its tensors' names, shapes or dtypes differ from "
                            "the weights it would be applied into")
    gets = st.setdefault("gets", TransferClock())
    if mode == WHOLE:
        _pull_whole(relay, run, version, manifest, part, batch_bytes, gets, applier, st)
        return manifest, applier.out
    rest = manifest.buckets[skip:]
    st["bytes"] += sum(b.nbytes for b in rest)
    st["buckets"] += len(rest)
    keys = [bucket_key(run, version, b.index, part) for b in rest]
    fetcher = BucketFetcher(relay, keys, rest, fetchers, depth, retries, gets, read)
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
    return manifest, applier.out


def _pull_whole(relay: Relay, run: str, version: int, manifest: Manifest, part: str,
                batch_bytes: int, gets: TransferClock, applier: BucketApplier,
                st: dict[str, Any]) -> None:
    """WHOLE: every bucket fetched, `batch_bytes` at a time, and verified before any is
    decoded; a bad bucket raises as it is (not fetched again) and nothing is built."""
    t0 = time.perf_counter()
    views: list[memoryview] = []
    for batch in batches(manifest, batch_bytes):
        keys = [bucket_key(run, version, i, part) for i in batch]
        t = time.perf_counter()
        try:
            blobs = relay.get_many(keys)
        except RelayKeyMissing as e:
            raise RelayKeyMissing(f"weights v{version} of run {run!r} incomplete: {e}") from None
        gets.add(sum(memoryview(b).nbytes for b in blobs), t, time.perf_counter())
        views += [verify_bucket(manifest.buckets[i], blob, key)
                  for i, blob, key in zip(batch, blobs, keys)]
    # counted once all is fetched (fetch_s stays 0 until then): a payload refused while
    # decoding was still fetched
    st["bytes"] += manifest.nbytes
    st["buckets"] += len(manifest.buckets)
    st["fetch_s"] += time.perf_counter() - t0

    def cost(item: tuple[memoryview, Any]) -> int:  # raw payloads are views: nothing to do
        meta = item[1].meta
        return 0 if meta.get("encoding") == "raw" else shape_bytes(meta)

    applier.apply_all([(manifest.buckets[i], view) for i, view in enumerate(views)], cost)
    st["hashes"].update(applier.spans.tensors())


def pull_weights(relay: Relay, run: str, version: int | None = None, batch_bytes: int = 1 << 30,
                 base: dict[str, torch.Tensor] | None = None, base_version: int | None = None,
                 stats: dict[str, float] | None = None, part: str = "",
                 manifest: Manifest | None = None,
                 workers: int = 1) -> tuple[int, dict[str, torch.Tensor]]:
    """Fetch `version` of `run` (None: the latest) and return (version, tensors): the
    pipeline's WHOLE mode.

    Buckets are fetched `batch_bytes` at a time and each is verified on arrival; tensors are
    built only once every bucket checked out (CorruptBucket otherwise, nothing returned).
    Raw tensors are views over the fetched buffers (no extra copy). `base`/`base_version` are
    what the receiver holds, for delta encodings (a payload whose base differs raises
    storage.delta.DeltaError). `stats`, if given, receives bytes, buckets, fetch_s and
    decode_s, and under "gets" a TransferClock of the relay gets
    (storage/weights/link_rate.py). `part` reads a snapshot pushed under the version's
    sub-prefix; `manifest` saves re-reading one already read; `workers` threads decode (raw
    payloads are views: they cost nothing to decode).
    """
    t0 = time.perf_counter()
    if version is None:
        version = latest_version(relay, run)
        if version is None:
            raise RelayKeyMissing(f"no weights of run {run!r} in the {relay.name} relay")
    if manifest is None:
        manifest = read_manifest(relay, run, version, part)
    gets = TransferClock() if stats is None else stats.setdefault("gets", TransferClock())
    st: dict[str, Any] = {"gets": gets}
    read_s = time.perf_counter() - t0
    try:
        _, out = pull_into(relay, run, version, manifest, None, base, base_version, mode=WHOLE,
                           part=part, workers=workers, batch_bytes=batch_bytes, stats=st)
    finally:
        if stats is not None and st.get("fetch_s"):  # every bucket fetched, decoded or not
            stats.update(bytes=st["bytes"], buckets=st["buckets"], fetch_s=read_s + st["fetch_s"])
    if stats is not None:
        stats["decode_s"] = st["apply_s"]
    return version, out
