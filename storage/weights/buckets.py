"""Buckets: named payloads packed into blobs of about `bucket_bytes`, described by a manifest.

A bucket is the unit pushed to and pulled from the relay (default 64 MB: few enough objects to
keep per-object overhead small, small enough to pipeline). Payloads are packed in order, each
at an offset aligned to 64 bytes (so typed views need no copy); a payload larger than a bucket
gets a bucket of its own. The manifest (JSON) lists every bucket's size and checksum and every
entry's name, offset, length, checksum and metadata. An entry's checksum is the content hash of
its bytes (storage/delta/content_hash.py), so a raw tensor's is its tensor's hash, which the
weights digest takes from it; a bucket's is xxh3-64 of its entries' checksums, and the padding
between them must be zeros: a packer hashes each byte once, not once per entry and again for
the bucket (a dense 0.5B publish hashed its 1 GB twice). Unpacking verifies all buckets first:
a corrupted or truncated bucket raises CorruptBucket naming the bucket and the entry, and nothing
is returned partially.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from storage.delta.content_hash import combine, content_hash
from storage.relay.base import Buffer

FORMAT = 1
HASH = "content/entries"  # entries: content hash; buckets: xxh3-64 of their entries'
ALIGN = 64
DEFAULT_BUCKET_BYTES = 64 << 20


class CorruptBucket(ValueError):
    """A bucket (or its manifest) does not match what was packed."""


class CorruptManifest(CorruptBucket):
    """The manifest itself is unreadable or inconsistent."""


def _digest(data: Buffer) -> str:
    return xxhash.xxh3_64(data).hexdigest()


def _entry_digest(data: Buffer) -> str:
    return f"{content_hash(data):016x}"


def _bucket_digest(entry_checksums: Iterable[str]) -> str:
    return f"{combine([int(c, 16) for c in entry_checksums]):016x}"


def _padding_is_zero(view: memoryview, entries: Sequence[Entry]) -> bool:
    """Whether every byte of the bucket outside its entries is zero (as packing leaves it)."""
    at, gaps = 0, []
    for e in sorted(entries, key=lambda e: e.offset):
        gaps.append((at, e.offset))
        at = max(at, e.offset + e.length)
    gaps.append((at, view.nbytes))
    return not any(np.frombuffer(view[a:b], np.uint8).any() for a, b in gaps if b > a)


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Entry:
    name: str
    offset: int
    length: int
    checksum: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BucketInfo:
    index: int
    nbytes: int
    checksum: str
    entries: tuple[Entry, ...]

    def as_dict(self) -> dict[str, Any]:
        """dataclasses.asdict's result without its deep copies (a few ms per manifest of a
        few hundred entries, on every publish); the metadata dicts are shared, not copied."""
        return {"index": self.index, "nbytes": self.nbytes, "checksum": self.checksum,
                "entries": [{"name": e.name, "offset": e.offset, "length": e.length,
                             "checksum": e.checksum, "meta": e.meta} for e in self.entries]}

    @classmethod
    def from_dict(cls, b: dict[str, Any]) -> "BucketInfo":
        return cls(b["index"], b["nbytes"], b["checksum"], tuple(Entry(**e) for e in b["entries"]))


@dataclass
class Manifest:
    """What a set of buckets holds; `version` is the caller's (e.g. the weights version)."""

    version: int
    buckets: list[BucketInfo]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    def entries(self) -> Iterator[tuple[BucketInfo, Entry]]:
        for b in self.buckets:
            for e in b.entries:
                yield b, e

    def to_json(self) -> bytes:
        body = {"format": FORMAT, "hash": HASH, "version": self.version, "meta": self.meta,
                "buckets": [b.as_dict() for b in self.buckets]}
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return json.dumps({"checksum": _digest(text.encode()), "body": text}).encode()

    @classmethod
    def from_json(cls, data: Buffer) -> "Manifest":
        try:
            outer = json.loads(bytes(data))
            text = outer["body"]
            if _digest(text.encode()) != outer["checksum"]:
                raise CorruptManifest("manifest checksum mismatch")
            body = json.loads(text)
            if body.get("format") != FORMAT or body.get("hash") != HASH:
                raise CorruptManifest(f"manifest format {body.get('format')}/{body.get('hash')}, "
                                      f"expected {FORMAT}/{HASH}")
            buckets = [BucketInfo.from_dict(b) for b in body["buckets"]]
        except CorruptManifest:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptManifest(f"manifest unreadable: {type(e).__name__}: {e}") from None
        for i, b in enumerate(buckets):
            if b.index != i:
                raise CorruptManifest(f"manifest lists bucket {b.index} at position {i}")
            for e in b.entries:
                if e.offset < 0 or e.length < 0 or e.offset + e.length > b.nbytes:
                    raise CorruptManifest(f"manifest: entry {e.name!r} lies outside bucket {i}")
        return cls(int(body["version"]), buckets, dict(body.get("meta") or {}))


Pending = list[tuple[str, memoryview, dict, int]]  # name, payload, meta, offset


def _close(index: int, pending: Pending) -> tuple[BucketInfo, memoryview]:
    _, last_view, _, last_off = pending[-1]
    # numpy, not bytearray: zeroed pages come lazily from calloc and copies run at memcpy
    # speed (bytearray slice assignment from a memoryview is ~5x slower).
    buf = np.zeros(max(ALIGN, _align(last_off + last_view.nbytes)), dtype=np.uint8)
    entries = []
    for name, view, meta, off in pending:
        buf[off:off + view.nbytes] = np.frombuffer(view, dtype=np.uint8)
        entries.append(Entry(name, off, view.nbytes, _entry_digest(view), meta))
    return BucketInfo(index, buf.nbytes, _bucket_digest(e.checksum for e in entries),
                      tuple(entries)), memoryview(buf)


def pack_buckets(items: Iterable[tuple[str, Buffer, dict[str, Any]]],
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, work: Sequence[int] | None = None
                 ) -> Iterator[tuple[BucketInfo, memoryview]]:
    """Yield (info, bucket bytes) as each bucket fills, so a caller can push while packing.
    `work`, if given, is what each payload in turn costs the receiver (e.g. the dense bytes a
    delta rewrites), known before it is encoded: a bucket also closes once its payloads' work
    would pass `bucket_bytes` with the next one's, so a sparse version still comes in several
    buckets a receiver can apply one by one; it goes as soon as its last payload is packed,
    not once the next one (perhaps a large tensor, slow to code) is encoded."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes must be >= {ALIGN}, got {bucket_bytes}")
    seen: set[tuple[str, Any]] = set()
    pending: Pending = []
    end, index, done = 0, 0, 0
    for i, (name, data, meta) in enumerate(items):
        key = (name, str(meta.get("span")))  # a tensor's blocks are payloads of their own
        if key in seen:
            raise ValueError(f"payload {name!r} appears twice")
        if work is not None and i >= len(work):
            raise ValueError(f"work gives the costs of {len(work)} payloads; {name!r} is one more")
        seen.add(key)
        try:
            json.dumps(meta)
        except TypeError as e:
            raise ValueError(f"metadata of {name!r} is not JSON-serializable: {e}") from None
        view = memoryview(data)
        view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
        offset = _align(end)
        if pending and view.nbytes and offset + view.nbytes > bucket_bytes:
            yield _close(index, pending)
            pending, offset, index, done = [], 0, index + 1, 0
        pending.append((name, view, dict(meta), offset))
        end, done = offset + view.nbytes, done + (work[i] if work else 0)
        following = work[i + 1] if work and i + 1 < len(work) else 0
        if following and done + following > bucket_bytes:
            yield _close(index, pending)
            pending, end, index, done = [], 0, index + 1, 0
    if pending:
        yield _close(index, pending)


def pack(items: Iterable[tuple[str, Buffer, dict[str, Any]]],
         bucket_bytes: int = DEFAULT_BUCKET_BYTES, version: int = 0,
         meta: dict[str, Any] | None = None) -> tuple[Manifest, list[memoryview]]:
    """All buckets at once, with their manifest."""
    infos, blobs = [], []
    for info, blob in pack_buckets(items, bucket_bytes):
        infos.append(info)
        blobs.append(blob)
    return Manifest(version, infos, dict(meta or {})), blobs


def batches(manifest: Manifest, batch_bytes: int) -> Iterator[list[int]]:
    """The manifest's bucket indices in runs of at most `batch_bytes` (one bucket at least):
    what a receiver fetches in one read."""
    batch, size = [], 0
    for b in manifest.buckets:
        if batch and size + b.nbytes > batch_bytes:
            yield batch
            batch, size = [], 0
        batch.append(b.index)
        size += b.nbytes
    if batch:
        yield batch


def verify_bucket(info: BucketInfo, data: Buffer, label: str | None = None) -> memoryview:
    """The bucket as a byte view if it matches `info`; else CorruptBucket naming the entry."""
    label = label or f"bucket {info.index}"
    view = memoryview(data).cast("B")
    if view.nbytes != info.nbytes:
        cut = next((e.name for e in info.entries if e.offset + e.length > view.nbytes), None)
        where = f", entry {cut!r} cut short" if cut else ""
        raise CorruptBucket(f"{label}: {view.nbytes} bytes, expected {info.nbytes}{where}")
    for e in info.entries:
        if _entry_digest(view[e.offset:e.offset + e.length]) != e.checksum:
            raise CorruptBucket(f"{label}: entry {e.name!r} checksum mismatch")
    if not _padding_is_zero(view, info.entries):
        raise CorruptBucket(f"{label}: checksum mismatch in padding between entries")
    if _bucket_digest(e.checksum for e in info.entries) != info.checksum:
        raise CorruptBucket(f"{label}: checksum mismatch: its entries' checksums do not make "
                            "the bucket's")
    return view


def unpack(manifest: Manifest, buckets: Sequence[Buffer],
           labels: Sequence[str] | None = None) -> dict[str, tuple[memoryview, dict[str, Any]]]:
    """name -> (payload view, metadata), after verifying every bucket."""
    if len(buckets) != len(manifest.buckets):
        raise CorruptBucket(f"{len(buckets)} buckets given, manifest lists {len(manifest.buckets)}")
    views = [verify_bucket(info, data, labels[i] if labels else None)
             for i, (info, data) in enumerate(zip(manifest.buckets, buckets))]
    return {e.name: (views[i][e.offset:e.offset + e.length], e.meta)
            for i, info in enumerate(manifest.buckets) for e in info.entries}
