"""Streaming a delta version: apply its buckets while the publisher is still encoding the rest.

A publisher that streams a version (storage/weights/publisher.publish_weights `announce`)
writes `announce` first (kind, base version, an attempt stamp) and each bucket's info right
after the bucket, the manifest still last. A receiver already waiting for that version and
holding its base follows the infos: it fetches bucket k, verifies it against its info and
applies it in place into the held weights while the publisher encodes bucket k+1, so the
receiver's work overlaps the sender's instead of following it. Once the manifest is there the
rest is pulled as usual, after checking that the manifest is the same attempt and lists exactly
the buckets already applied: this is the streamed mode of the receiver's pipeline
(storage/weights/apply_pipeline.pull_into), which calls `follow_stream` for the first part.

The held weights are half old, half new while this runs: the receiver holds no version until
the whole set's digest checks out (storage/weights/receiver.py), and the engine is handed
nothing before that. A publish that stops (no new bucket and no manifest within `timeout_s`)
or starts again (another attempt stamp) raises StreamBroken; the receiver then takes a full
snapshot, as after any pull that failed partway.

Waiting for the next bucket is polling the relay (one existence check of two keys: ~0.1 ms of
a Mooncake master's time and as much of the receiver's): every POLL_MIN_S just after a bucket
landed, backing off to an eighth of the mean gap between buckets (at most POLL_MAX_S), so a
long publish, or a slow link, costs the relay tens of checks a second per receiver instead of
hundreds, and the version is seen complete at most an eighth of a gap late.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from storage.relay.base import Relay, RelayKeyMissing
from storage.weights.buckets import BucketInfo, CorruptBucket, Manifest, verify_bucket
from storage.weights.link_rate import TransferClock
from storage.weights.versions import (announce_key, bucket_info_key, bucket_key, manifest_key,
                                      read_manifest)

POLL_MIN_S, POLL_MAX_S = 0.001, 0.05


class StreamBroken(CorruptBucket):
    """The streamed publish stopped or started again before its manifest."""


def announcement(relay: Relay, run: str, version: int) -> dict[str, Any] | None:
    """What the publisher announced for `version`, or None (not streamed, or not begun)."""
    try:
        found = json.loads(relay.get(announce_key(run, version)))
    except (RelayKeyMissing, ValueError):
        return None
    return found if isinstance(found, dict) and "attempt" in found else None


def await_published(relay: Relay, run: str, version: int, await_s: float,
                    base_version: int | None, poll_s: float = 0.001) -> dict[str, Any] | None:
    """Wait until `version` is announced as a delta onto `base_version` (the announcement: it
    can be streamed) or complete (None); TimeoutError when neither happens within `await_s`."""
    started = time.monotonic()
    deadline = started + await_s
    announced: dict[str, Any] | None = None
    keys = [manifest_key(run, version), announce_key(run, version)]
    while True:
        complete, announced_now = relay.exists_many(keys)
        if complete:
            break
        if announced is None and announced_now:
            announced = announcement(relay, run, version)
            if announced is not None and announced.get("kind") == "delta" \
                    and base_version is not None and announced.get("base_version") == base_version:
                return announced
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run!r}: v{version} was not published within {await_s:g} s")
        time.sleep(poll_s)
        if time.monotonic() > started + 0.25:  # a small version is out within that: look
            poll_s = min(2 * poll_s, 0.02)     # often, then back off for a long publish
    return None


def follow_stream(relay: Relay, run: str, version: int, announced: dict[str, Any],
                  apply: Callable[[BucketInfo, memoryview], None], st: dict[str, Any],
                  timeout_s: float = 60.0, retries: int = 2) -> tuple[Manifest, int]:
    """`apply` each bucket of the delta `version` (into the held weights, in place: the
    pipeline's BucketApplier) as it is published; once the manifest is there, (manifest, buckets applied),
    the rest left to the pipeline (storage/weights/apply_pipeline.pull_into). `st` as
    pull_into's, plus `streamed` (buckets applied before the manifest) and `polls` (relay
    checks made)."""
    st["streamed"], st["polls"] = 0, 0
    attempt, done = announced["attempt"], []
    idle_since = first_at = time.monotonic()  # first_at: once the first bucket was applied
    poll_s = POLL_MIN_S
    while True:
        key = bucket_info_key(run, version, len(done))
        complete, next_there = relay.exists_many([manifest_key(run, version), key])
        st["polls"] += 1
        if complete:
            break
        if not next_there:
            waited = time.monotonic() - idle_since
            if waited > timeout_s:
                raise StreamBroken(f"v{version}: no bucket {len(done)} and no manifest within "
                                   f"{timeout_s:g} s (the publish stopped)")
            time.sleep(poll_s)
            # the mean gap between buckets so far (not the wait for the first: the sender's
            # coding before it), else this wait itself
            gap = (idle_since - first_at) / (len(done) - 1) if len(done) > 1 else waited
            poll_s = min(2 * poll_s, max(POLL_MIN_S, min(POLL_MAX_S, gap / 8)))
            continue
        poll_s = POLL_MIN_S
        info = _info(relay, key, attempt, version)
        t = time.perf_counter()
        view = _fetch(relay, bucket_key(run, version, info.index), info, retries, st)
        st["fetch_s"] += time.perf_counter() - t
        apply(info, view)
        done.append(info)
        st["streamed"] += 1
        idle_since = time.monotonic()
        if len(done) == 1:
            first_at = idle_since
    manifest = read_manifest(relay, run, version)
    if manifest.meta.get("attempt") != attempt or manifest.buckets[:len(done)] != done:
        raise StreamBroken(f"v{version} was published again while it was streamed (attempt "
                           f"{manifest.meta.get('attempt')}, streamed {attempt})")
    return manifest, len(done)


def _info(relay: Relay, key: str, attempt: str, version: int) -> BucketInfo:
    try:
        note = json.loads(relay.get(key))
        info = BucketInfo.from_dict(note["bucket"])
    except RelayKeyMissing:  # removed after exists(): a re-publish began
        raise StreamBroken(f"v{version}: {key} went away (published again)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptBucket(f"{key} unreadable: {type(e).__name__}: {e}") from None
    if note.get("attempt") != attempt:
        raise StreamBroken(f"v{version} was published again while it was streamed")
    return info


def _fetch(relay: Relay, key: str, info: BucketInfo, retries: int,
           st: dict[str, Any]) -> memoryview:
    """The bucket, verified; a torn read is fetched again up to `retries` times."""
    for attempt in range(retries + 1):
        start = time.perf_counter()
        try:
            blob = relay.get_many([key])[0]
        except RelayKeyMissing:
            raise StreamBroken(f"{key} went away (published again)") from None
        st.setdefault("gets", TransferClock()).add(memoryview(blob).nbytes, start,
                                                   time.perf_counter())
        st["bytes"] += memoryview(blob).nbytes
        st["buckets"] += attempt == 0
        try:
            return verify_bucket(info, blob, key)
        except CorruptBucket as e:
            st["rejected"] += 1
            if attempt == retries:
                raise CorruptBucket(f"{e} (rejected {retries + 1} times)") from None
    raise AssertionError("unreachable")
