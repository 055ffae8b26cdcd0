"""A run's weight versions in the relay: the keys each is written under, the order that makes
one visible, which are held, and reading that back.

Keys of a run (versions never share a key, so a reader never mixes two):
  rose/<run>/v<version>/bucket-<i>   packed tensor payloads (storage/weights/buckets.py)
  rose/<run>/v<version>/announce     written FIRST when the version is streamed: its kind, base
                                     and attempt, so receivers start before the manifest
  rose/<run>/v<version>/bucket-<i>.info  each bucket's info, right after the bucket (streamed)
  rose/<run>/v<version>/manifest     written LAST: a version is complete once it exists; its
                                     meta says kind "full" or "delta" (and the delta's base)
  rose/<run>/v<version>/full/...     a full snapshot of a delta version, pushed on request
                                     (`part="full"`, storage/weights/snapshot_server.py)
  rose/<run>/v<version>/full-request a receiver's request for that snapshot
  rose/<run>/latest                  {"version": v}, replaced after the manifest
  rose/<run>/versions                versions held, the one being pushed included (a failed
                                     push's leftovers are pruned in turn); those older than
                                     version-2 are removed before it (at most 3 held at once)
A part of a version (storage/weights/sharded_versions.py) has the same keys under its own prefix
(`part`), its full snapshot and request under `<part>/full/` and `<part>/full-request`.
"""
from __future__ import annotations

import json

from storage.relay.base import Buffer, Relay, RelayKeyMissing
from storage.weights.buckets import CorruptBucket, Manifest

KEEP_PREVIOUS = 2  # versions kept behind the newest, for receivers still pulling them


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


def full_part(part: str = "") -> str:
    """Where the full snapshot of a version (or of one `part` of it) is pushed on request."""
    return f"{part}/full" if part else "full"


def request_key(run: str, version: int, part: str = "") -> str:
    """Where a receiver asks for a full snapshot of `version` (or of its `part`)
    (storage/weights/snapshot_server.py)."""
    return f"{version_prefix(run, version, part)}full-request"


def latest_key(run: str) -> str:
    return f"rose/{run}/latest"


def versions_key(run: str) -> str:
    return f"rose/{run}/versions"


def hold_versions(relay: Relay, run: str, version: int,
                  known: frozenset[int] | None = None) -> set[int]:
    """Remove versions older than version - KEEP_PREVIOUS and list the versions held, `version`
    included, under the run's versions key; those versions (`known`: the held ones as the
    caller knows them, else as the relay says)."""
    try:
        held = set(known) if known is not None else \
            {int(v) for v in json.loads(relay.get(versions_key(run)))}
    except (RelayKeyMissing, ValueError, TypeError):  # none yet, or unreadable: start afresh
        held = set()
    keep = {v for v in held if v >= version - KEEP_PREVIOUS} | {version}
    for old in sorted(held - keep):
        relay.remove_prefix(version_prefix(run, old))
    relay.put(versions_key(run), json.dumps(sorted(keep)).encode())
    return keep


def commit_version(relay: Relay, run: str, version: int, manifest: Manifest) -> None:
    """Make `version` visible with `manifest` when its payloads went out as parts pushed by
    others (storage/weights/sharded_versions.py): prune and list the versions held, this one
    included, as publish_weights does, then the manifest, then `latest`, in the order a
    reader relies on."""
    hold_versions(relay, run, version)
    relay.put(manifest_key(run, version), manifest.to_json())
    relay.put(latest_key(run), json.dumps({"version": version}).encode())


def latest_version(relay: Relay, run: str) -> int | None:
    """The newest complete version of `run` in the relay, or None if none was published."""
    try:
        return int(json.loads(relay.get(latest_key(run)))["version"])
    except RelayKeyMissing:
        return None


def read_manifest(relay: Relay, run: str, version: int, part: str = "",
                  value: Buffer | None = None) -> Manifest:
    """The verified manifest of `version` (or its part; `value`: its bytes if read already)."""
    key = manifest_key(run, version, part)
    try:
        manifest = Manifest.from_json(relay.get(key) if value is None else value)
    except RelayKeyMissing:
        what = f"{part} snapshot of weights" if part else "weights"
        raise RelayKeyMissing(f"{what} v{version} of run {run!r} are not in the {relay.name} "
                              "relay (not published yet, pruned, or lost)") from None
    if manifest.version != version or manifest.meta.get("run") != run:
        raise CorruptBucket(f"manifest under {key} describes "
                            f"run {manifest.meta.get('run')!r} v{manifest.version}")
    return manifest
