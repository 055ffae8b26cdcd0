"""Publish policy weights through a relay (pulled back bit-exactly by
storage/weights/apply_pipeline.py).

The relay keys a version is written under, and reading its manifest back:
storage/weights/versions.py (the manifest is written last: a version is complete once it
exists). Each payload carries its `encoding` in the entry metadata with dtype and shape
("raw", "rsdt" or one added with register_decoder): storage/weights/payloads.py.
"""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from storage.weights.buckets import (DEFAULT_BUCKET_BYTES, BucketInfo, Manifest,
                                     pack_buckets)
from storage.weights.parallel import ordered_map
from storage.weights.payloads import Encoder, raw_encoder
from storage.weights.push_pipeline import BucketPusher
from storage.weights.spans import Piece, piece_bytes, pieces
from storage.relay.base import Buffer, Relay
from storage.weights.versions import (announce_key, bucket_info_key, bucket_key, hold_versions,
                                      latest_key, manifest_key, version_prefix)


@dataclass(frozen=True)
class PublishStats:
    version: int
    tensors: int
    bytes: int          # bucket bytes pushed (payloads + alignment padding)
    buckets: int
    serialize_s: float  # encode + pack + checksum
    push_s: float       # relay puts (buckets, manifest, pointers) and pruning
    put_bytes: int = 0  # bucket bytes put by the pusher thread, and the seconds some put of
    put_s: float = 0.0  # them was under way (storage/weights/link_rate.py: the put leg)
    held_versions: frozenset[int] | None = None  # the run's versions in the relay after it


def publish_weights(relay: Relay, run: str, version: int, tensors: dict[str, torch.Tensor],
                    bucket_bytes: int = DEFAULT_BUCKET_BYTES, encoder: Encoder = raw_encoder,
                    meta: dict[str, Any] | Callable[[list[BucketInfo]], dict[str, Any]]
                    | None = None,
                    part: str = "", workers: int = 1, pipelined: bool = True,
                    announce: dict[str, Any] | None = None,
                    work: bool = False,
                    held_versions: frozenset[int] | None = None,
                    split: bool = False) -> PublishStats:
    """Push `tensors` as `version` of `run`: buckets, then the manifest, then `latest`.

    `meta` goes into the manifest (e.g. kind and base version); a callable is called with the
    bucket infos once every bucket is packed, for what is only known then (a digest of what was
    encoded: a raw entry's checksum is its tensor's hash, storage/weights/digest.py), while the
    last buckets are still being put: its work overlaps the link. With `part` (e.g. "full") the
    payloads go under the version's sub-prefix instead, next to what is published there, and
    neither `latest` nor the held versions change. `workers` threads run `encoder` ahead of
    the pushes (storage/weights/parallel.py); it must then be safe to call from threads.
    `pipelined`: puts run on a thread of their own while the next bucket is encoded and packed
    (storage/weights/push_pipeline.py); the manifest still goes out only after every bucket.
    `announce` (streamed, not with `part`): written first with this attempt's stamp, and each
    bucket's info right after the bucket, so a receiver may apply buckets before the manifest
    (storage/weights/stream_pull.py); `work`: buckets also close by the dense bytes their
    tensors rewrite, before the next one is encoded (storage/weights/buckets.pack_buckets).
    The manifest carries the attempt's stamp. `split`: a tensor of blocks.SPLIT_BYTES or more
    goes out as span entries, one per block, `encoder(name, tensor, span)` coding each
    (storage/weights/spans.py).
    `held_versions`: the run's versions as its only publisher's last publish left them
    (PublishStats.held_versions): not read from the relay (a round trip, a WAN RTT, saved).
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be an int >= 0, got {version!r}")
    t_start = time.perf_counter()
    attempt = uuid.uuid4().hex[:16]  # tells a streaming receiver one attempt from a re-publish
    streamed = announce is not None and not part
    held: set[int] = set()  # the versions kept, once pruned

    def before_first_bucket() -> None:
        # Make room first, so the relay holds at most versions.KEEP_PREVIOUS + 1 at any time.
        if not part:
            held.update(hold_versions(relay, run, version, held_versions))
        relay.remove_prefix(version_prefix(run, version, part))  # a re-publish: no stale bucket
        if streamed:
            relay.put(announce_key(run, version),
                      json.dumps({**announce, "attempt": attempt}).encode())

    work_items = pieces(tensors, split)

    def encode(item: Piece) -> tuple[str, Buffer, dict[str, Any]]:
        name, tensor, span = item
        data, entry_meta = encoder(name, tensor) if span is None else encoder(name, tensor, span)
        whole = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
        return name, data, {**whole, **entry_meta} if span is None else \
            {**entry_meta, **whole, "span": list(span)}

    def items() -> Iterator[tuple[str, Buffer, dict[str, Any]]]:
        return ordered_map(encode, work_items, workers, piece_bytes)

    infos, total, serialize_s = [], 0, 0.0
    pusher = BucketPusher(relay, first=before_first_bucket) if pipelined else None
    if not pusher:  # else the pusher's thread does it while the first bucket is packed
        before_first_bucket()
    t = time.perf_counter()
    try:
        costs = [piece_bytes(item) for item in work_items] if work else None
        for info, blob in pack_buckets(items(), bucket_bytes, costs):
            serialize_s += time.perf_counter() - t
            key = bucket_key(run, version, info.index, part)
            after = None if not streamed else (bucket_info_key(run, version, info.index),
                                               json.dumps({"attempt": attempt,
                                                           "bucket": info.as_dict()}).encode())
            if pusher:  # the put is not serializing
                pusher.put(key, blob, after)
            else:
                relay.put(key, blob)
                if after:
                    relay.put(*after)
            infos.append(info)
            total += info.nbytes
            t = time.perf_counter()
        serialize_s += time.perf_counter() - t
        if callable(meta):  # every tensor is encoded; the last buckets may still be in flight
            meta = meta(infos)
        if pusher:  # every bucket in the relay before the manifest: never half a version
            pusher.close()
    finally:
        if pusher:
            pusher.abort()
    manifest = Manifest(version, infos, {"kind": "full", **(meta or {}), "run": run,
                                         "tensors": len(tensors), "published_at": time.time(),
                                         "attempt": attempt})
    relay.put(manifest_key(run, version, part), manifest.to_json())
    if not part:
        relay.put(latest_key(run), json.dumps({"version": version}).encode())
    push_s = time.perf_counter() - t_start - serialize_s
    puts = (pusher.puts.bytes, pusher.puts.seconds) if pusher else (0, 0.0)
    return PublishStats(version, len(tensors), total, len(infos), serialize_s, push_s, *puts,
                        held_versions=None if part else frozenset(held))
