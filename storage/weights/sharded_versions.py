"""A sharded version in the relay: its commit, and reading it back.

Relay keys of a sharded version (next to the unsharded ones, storage/weights/versions.py):
  rose/<run>/v<v>/shards/r<t>.<p>.<d>/<group>/bucket-<i>, .../manifest
      one part per trainer rank and object group (storage/shards/grain.py): its own buckets and
      manifest, pushed by that rank alone (storage/weights/sharded_publisher.py), full or as a
      delta of the rank's previous push
  rose/<run>/v<v>/manifest   kind "sharded", written by `commit_sharded` once every part's
      manifest is in the relay: the layout, the parameters (name, shape, rule) and each part's
      published_at and digest. Then `latest`. A version is never visible half-published: a
      receiver reads parts only through a committed manifest, and refuses a part whose stamp
      differs from the one committed.
  rose/<run>/v<v>/shards/.../<group>/full-request, answered under .../<group>/full/
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from storage.relay.base import Relay, RelayKeyMissing
from storage.shards.grain import PublishLayout, rank_parts
from storage.shards.layout import ParallelLayout
from storage.shards.plan import ParamSpec
from storage.shards.rules import ShardRule
from storage.weights.buckets import CorruptBucket, Manifest
from storage.weights.versions import commit_version, read_manifest

SHARDED = "sharded"


def specs_meta(params: list[ParamSpec]) -> list[dict[str, Any]]:
    return [{"name": p.name, "shape": list(p.shape), "rule": asdict(p.rule), "itemsize": p.itemsize}
            for p in params]


def specs_from_meta(meta: list[dict[str, Any]]) -> list[ParamSpec]:
    return [ParamSpec(m["name"], tuple(m["shape"]), ShardRule(**m["rule"]), int(m["itemsize"])) for m in meta]


def layout_meta(layout: PublishLayout) -> dict[str, int]:
    t = layout.trainer
    return {"tp": t.tp, "pp": t.pp, "dp": t.dp, "split": layout.split}


def layout_from_meta(meta: dict[str, int]) -> PublishLayout:
    return PublishLayout(ParallelLayout(meta["tp"], meta["pp"], meta["dp"]), meta["split"])


def expected_parts(params: list[ParamSpec], layout: PublishLayout) -> list[str]:
    return sorted(part for parts in rank_parts(params, layout).values() for part in parts)


def commit_sharded(relay: Relay, run: str, version: int, layout: PublishLayout, params: list[ParamSpec],
                   timeout_s: float = 120.0, poll_s: float = 0.05) -> Manifest:
    """Make `version` visible once every trainer rank's parts are in the relay (waits up to
    timeout_s for the others; TimeoutError naming the missing parts)."""
    want, infos = expected_parts(params, layout), {}
    deadline = time.monotonic() + timeout_s
    while True:
        for part in [p for p in want if p not in infos]:
            try:
                m = read_manifest(relay, run, version, part)
            except RelayKeyMissing:
                continue
            infos[part] = {"published_at": m.meta["published_at"], "digest": m.meta.get("digest"),
                           "kind": m.meta.get("kind"), "base_version": m.meta.get("base_version"),
                           "bytes": m.nbytes}
        missing = [p for p in want if p not in infos]
        if not missing:
            break
        if time.monotonic() >= deadline:
            raise TimeoutError(f"run {run!r} v{version}: parts {missing[:4]} ({len(missing)} in all) "
                               f"not pushed within {timeout_s:g} s")
        time.sleep(poll_s)
    manifest = Manifest(version, [], {"kind": SHARDED, "run": run, "layout": layout_meta(layout),
                                      "params": specs_meta(params), "parts": infos,
                                      "published_at": time.time()})
    commit_version(relay, run, version, manifest)
    return manifest


def read_sharded(relay: Relay, run: str, version: int) -> tuple[Manifest, PublishLayout, list[ParamSpec]]:
    """The committed manifest of a sharded `version`, its layout and parameters."""
    manifest = read_manifest(relay, run, version)
    if manifest.meta.get("kind") != SHARDED:
        raise CorruptBucket(f"run {run!r} v{version} was published {manifest.meta.get('kind')!r}, not sharded")
    return manifest, layout_from_meta(manifest.meta["layout"]), specs_from_meta(manifest.meta["params"])
