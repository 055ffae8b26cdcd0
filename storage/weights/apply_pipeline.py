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

import time
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
from storage.weights.versions import bucket_key, latest_version, read_manifest


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
    fetcher = BucketFetcher(relay, keys, rest, fetchers, depth, retries,
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


def pull_weights(relay: Relay, run: str, version: int | None = None, batch_bytes: int = 1 << 30,
                 base: dict[str, torch.Tensor] | None = None, base_version: int | None = None,
                 stats: dict[str, float] | None = None, part: str = "",
                 manifest: Manifest | None = None,
                 workers: int = 1) -> tuple[int, dict[str, torch.Tensor]]:
    """Fetch `version` of `run` (None: the latest) and return (version, tensors).

    Buckets are fetched `batch_bytes` at a time and each is verified on arrival; tensors are
    built only once every bucket checked out (CorruptBucket otherwise, nothing returned).
    Raw tensors are views over the fetched buffers (no extra copy). `base`/`base_version` are
    what the receiver holds, for delta encodings (a payload whose base differs raises
    storage.delta.DeltaError). `stats`, if given, receives timings, and under "gets" a
    TransferClock of the relay gets (storage/weights/link_rate.py). `part` reads a snapshot
    pushed under the version's sub-prefix; `manifest` saves re-reading one already read;
    `workers` threads decode (raw payloads are views: they cost nothing to decode).
    """
    t0 = time.perf_counter()
    if version is None:
        version = latest_version(relay, run)
        if version is None:
            raise RelayKeyMissing(f"no weights of run {run!r} in the {relay.name} relay")
    if manifest is None:
        manifest = read_manifest(relay, run, version, part)
    views: list[memoryview] = []
    gets = TransferClock() if stats is None else stats.setdefault("gets", TransferClock())
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
    t1 = time.perf_counter()
    if stats is not None:  # before decoding: a payload refused there was still fetched
        stats.update(bytes=manifest.nbytes, buckets=len(manifest.buckets), fetch_s=t1 - t0)
    targets = SpanTargets(None, in_place=False)

    def decode(item: tuple[Any, Any]) -> torch.Tensor:
        bucket, entry = item
        payload = views[bucket.index][entry.offset:entry.offset + entry.length]
        return decode_entry(entry.name, payload, entry.meta, base, base_version, targets)

    def cost(item: tuple[Any, Any]) -> int:
        meta = item[1].meta
        return 0 if meta.get("encoding") == "raw" else shape_bytes(meta)

    entries = list(manifest.entries())
    out = {entry.name: t for (_, entry), t in zip(entries, ordered_map(decode, entries, workers,
                                                                     cost))}
    if stats is not None:
        stats["decode_s"] = time.perf_counter() - t1
    return version, out
