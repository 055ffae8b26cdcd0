"""The receiving side of sharded publishing: one rank of a serving layout pulls only its slices.

`ShardedReceiver.pull(v)` reads v's committed manifest (storage/weights/sharded_versions.py), computes
from the trainer's layout and its own (storage/shards/grain.receiver_pieces) which published
objects overlap its slices, fetches only the parts holding them (pull_weights: every bucket
verified, deltas decoded onto the objects it holds), checks each part against the digest the
commit recorded, and assembles its local tensors from the pieces. Like WeightReceiver it never
applies a version partially: everything is built aside and swapped in by one assignment.

A part published as a delta is applied only onto the held objects of its base version. A part
this receiver cannot use (a delta onto objects it does not hold: it joined late, lagged, or its
layout changed; a damaged or lost bucket; a digest that differs) is taken as a full snapshot
instead, asked of the publisher of that part alone, as the unsharded path does for a version
(storage/weights/snapshot_server.py: `<part>/full-request`, answered under `<part>/full/`),
waiting up to `full_timeout_s`; with full_timeout_s None it raises NeedsFullSnapshot instead.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from storage.delta import kernels
from storage.relay.base import Relay, RelayKeyMissing
from storage.shards.grain import PublishLayout, receiver_pieces, rank_parts
from storage.shards.layout import ParallelLayout, Rank
from storage.shards.plan import apply_pull
from storage.shards.rules import ShardRule
from storage.weights.buckets import CorruptBucket, Manifest
from storage.cores import available_cores
from storage.weights.apply_pipeline import pull_weights
from storage.weights.sharded_versions import read_sharded
from storage.weights.snapshot_wait import UNUSABLE, SnapshotWait
from storage.weights.digest import tensors_digest
from storage.weights.versions import full_part, latest_version, read_manifest, request_key


class NeedsFullSnapshot(RuntimeError):
    """A needed part is unusable here (e.g. a delta onto objects this receiver does not hold)
    and no full snapshot of it was asked for, or none arrived in time."""


@dataclass
class ShardPullReport:
    version: int
    mode: str  # "full", "delta" (every fetched part a delta), "mixed" or "noop"
    base_version: int | None
    fallback: str = ""  # why parts were taken as full snapshots on request ("" when none was)
    bytes: int = 0  # bucket bytes fetched
    buckets: int = 0
    parts: list[str] = field(default_factory=list)
    published_bytes: int = 0  # every part of the version: what an unsharded pull would fetch
    fetch_s: float = 0.0
    apply_s: float = 0.0
    seconds: float = 0.0
    get_bytes: int = 0  # the relay gets alone, as receiver.PullReport's (parts one by one)
    get_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ShardedReceiver:
    """Holds one serving rank's slices of one run's weights as last pulled."""

    def __init__(self, relay: Relay, run: str, layout: ParallelLayout = ParallelLayout(1),
                 rank: Rank = (0, 0, 0), server_rules: dict[str, ShardRule] | None = None,
                 batch_bytes: int = 1 << 30, workers: int | None = None, requester: str = "receiver",
                 full_timeout_s: float | None = None) -> None:
        if rank not in layout.ranks():
            raise ValueError(f"rank {rank} is not a rank of receiver layout {layout}")
        self.relay, self.run, self.layout, self.rank = relay, run, layout, rank
        self.server_rules, self.batch_bytes = server_rules, batch_bytes
        self.requester, self.full_timeout_s = requester, full_timeout_s
        kernels.warm_up_in_background()  # the codec's kernels, before the first delta
        self.workers = available_cores() if workers is None else max(1, workers)
        self.tensors: dict[str, torch.Tensor] | None = None  # param name -> this rank's slice
        self.version: int | None = None
        self.digest = ""  # tensors_digest of `tensors`
        self._objects: dict[str, torch.Tensor] = {}  # published objects held: the deltas' base
        self._parts: dict[str, Any] = {}  # part -> published_at of what is held

    def pull(self, version: int | None = None, accept_newer: bool = False) -> ShardPullReport:
        """Hold `version` (None, or a newer one with accept_newer: the latest) afterwards, or
        raise holding what was held."""
        t0 = time.perf_counter()
        latest = latest_version(self.relay, self.run) if version is None or accept_newer else None
        target = max((v for v in (version, latest) if v is not None), default=None)
        if target is None:
            raise RelayKeyMissing(f"no weights of run {self.run!r} in the {self.relay.name} relay")
        manifest, layout, params = read_sharded(self.relay, self.run, target)
        parts_meta = manifest.meta["parts"]
        report = ShardPullReport(target, "noop", self.version,
                                 published_bytes=sum(int(p["bytes"]) for p in parts_meta.values()))
        committed = {part: parts_meta[part]["published_at"] for part in parts_meta}
        if self.version == target and all(committed.get(p) == at for p, at in self._parts.items()):
            return report
        pieces = receiver_pieces(params, layout, self.layout, self.rank, server_rules=self.server_rules)
        needed = self._needed_parts(params, layout, {piece.key for piece in pieces})
        objects: dict[str, torch.Tensor] = {}
        modes = set()
        for part in needed:
            modes.add(self._fetch_part(target, part, parts_meta[part], objects, report))
        t = time.perf_counter()
        try:
            local = apply_pull(pieces, objects.__getitem__)
        except KeyError as e:
            raise CorruptBucket(f"v{target}: object {e} missing from the parts that should hold it") from None
        digest = tensors_digest(local)
        report.apply_s += time.perf_counter() - t
        # the only mutation, all or nothing
        self.tensors, self.version, self.digest = local, target, digest
        self._objects, self._parts = objects, {p: committed[p] for p in needed}
        report.mode = modes.pop() if len(modes) == 1 else ("mixed" if modes else "full")
        report.seconds = time.perf_counter() - t0
        return report

    @staticmethod
    def _needed_parts(params: list, layout: PublishLayout, names: set[str]) -> list[str]:
        """Parts holding any object this rank needs (they are whole units: one fetch each)."""
        return sorted(part for parts in rank_parts(params, layout).values()
                      for part, objs in parts.items() if any(o.key in names for o in objs))

    def _fetch_part(self, target: int, part: str, committed: dict[str, Any],
                    objects: dict[str, torch.Tensor], report: ShardPullReport) -> str:
        """Fetch, verify and decode one part into `objects`; its mode: "delta", or "full" (as
        published, or its full snapshot on request when the published one is unusable here)."""
        try:
            manifest = read_manifest(self.relay, self.run, target, part)
            if manifest.meta.get("published_at") != committed["published_at"]:  # never usable
                raise RuntimeError(f"v{target}/{part} was pushed again after the version was committed")
            delta = manifest.meta.get("kind") == "delta"
            names = {entry.name for _, entry in manifest.entries()}
            if delta and (self.version != manifest.meta.get("base_version") or not names <= self._objects.keys()):
                raise NeedsFullSnapshot(f"v{target}/{part} is a delta onto v{manifest.meta.get('base_version')}, "
                                        f"this receiver holds v{self.version}")
            objects.update(self._pull_part(target, part, manifest, committed, report, delta))
            return "delta" if delta else "full"
        except (NeedsFullSnapshot, *UNUSABLE) as e:
            if self.full_timeout_s is None:
                raise
            reason = f"{type(e).__name__}: {e}"
        report.fallback = "; ".join(filter(None, [report.fallback, reason]))
        objects.update(self._full_snapshot(target, part, committed, report, reason))
        return "full"

    def _pull_part(self, target: int, part: str, manifest: Manifest, committed: dict[str, Any],
                   report: ShardPullReport, delta: bool = False) -> dict[str, torch.Tensor]:
        """The objects of one part (or of its full snapshot), checked against the digest the
        commit recorded for the part; what crossed the wire is counted even when unusable."""
        stats: dict[str, Any] = {}
        try:
            _, tensors = pull_weights(self.relay, self.run, target, self.batch_bytes,
                                      base=self._objects if delta else None,
                                      base_version=self.version if delta else None, stats=stats,
                                      part=part, manifest=manifest, workers=self.workers)
        finally:
            report.bytes += int(stats.get("bytes", 0))
            report.buckets += int(stats.get("buckets", 0))
            report.fetch_s += stats.get("fetch_s", 0.0)
            report.apply_s += stats.get("decode_s", 0.0)
            if "gets" in stats:
                report.get_bytes += stats["gets"].bytes
                report.get_s += stats["gets"].seconds
        want = committed.get("digest")
        if want is not None and tensors_digest(tensors) != want:  # end to end, per part
            raise CorruptBucket(f"v{target}/{part}: digest differs from the publisher's {want}")
        report.parts.append(part)
        return tensors

    def _full_snapshot(self, target: int, part: str, committed: dict[str, Any],
                       report: ShardPullReport, reason: str) -> dict[str, torch.Tensor]:
        """The full snapshot of one part of `target`: the one in the relay if usable, else
        asked of the part's publisher (again, naming a damaged one) until full_timeout_s."""
        snapshot, damaged = full_part(part), []

        def attempt() -> tuple[dict[str, torch.Tensor] | None, bool]:
            try:
                manifest = read_manifest(self.relay, self.run, target, snapshot)
            except RelayKeyMissing:
                return None, False
            if manifest.meta.get("published_at") in damaged:
                return None, False
            try:
                return self._pull_part(target, snapshot, manifest, committed, report), False
            except UNUSABLE:
                damaged.append(manifest.meta.get("published_at"))
                return None, True

        def ask() -> None:
            body = {"by": self.requester, "reason": reason, "damaged": damaged}
            self.relay.put(request_key(self.run, target, part), json.dumps(body).encode())

        def give_up(relay_error: str) -> NeedsFullSnapshot:
            return NeedsFullSnapshot(f"no full snapshot of v{target}/{part} within "
                                     f"{self.full_timeout_s:g} s (is its publisher serving "
                                     f"requests?); wanted because {reason}{relay_error}")

        return SnapshotWait(float(self.full_timeout_s or 0.0)).until(attempt, ask, give_up)
