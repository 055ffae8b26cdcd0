"""Where a run's weight versions live in the relay: every key, in one place.

Keys of a run (versions never share a key, so a reader never mixes two):
  rose/<run>/v<version>/bucket-<i>   packed tensor payloads (storage/weights/buckets.py)
  rose/<run>/v<version>/announce     written FIRST when the version is streamed: its kind, base
                                     and attempt, so receivers start before the manifest
  rose/<run>/v<version>/bucket-<i>.info  each bucket's info, right after the bucket (streamed)
  rose/<run>/v<version>/manifest     written LAST: a version is complete once it exists; its
                                     meta says kind "full" or "delta" (and the delta's base)
  rose/<run>/v<version>/full/...     a full snapshot of a delta version, pushed on request
                                     (`part="full"`, storage/weights/sparse_publisher.py)
  rose/<run>/v<version>/full-request a receiver's request for that snapshot
  rose/<run>/latest                  {"version": v}, replaced after the manifest
  rose/<run>/versions                versions held, the one being pushed included (a failed
                                     push's leftovers are pruned in turn); those older than
                                     version-2 are removed before it (at most 3 held at once)
"""
from __future__ import annotations


def version_prefix(run: str, version: int, part: str = "") -> str:
    return f"rose/{run}/v{version}/" + (f"{part}/" if part else "")


def bucket_key(run: str, version: int, index: int, part: str = "") -> str:
    return f"{version_prefix(run, version, part)}bucket-{index}"


def announce_key(run: str, version: int) -> str:
    return f"{version_prefix(run, version)}announce"


def bucket_info_key(run: str, version: int, index: int) -> str:
    return f"{bucket_key(run, version, index)}.info"


def manifest_key(run: str, version: int, part: str = "") -> str:
    return f"{version_prefix(run, version, part)}manifest"


def request_key(run: str, version: int) -> str:
    """Where a receiver asks for a full snapshot of `version` (storage/weights/sparse_publisher.py)."""
    return f"{version_prefix(run, version)}full-request"


def latest_key(run: str) -> str:
    return f"rose/{run}/latest"


def versions_key(run: str) -> str:
    return f"rose/{run}/versions"
