"""The receiving side of sparse publishing: hold the current bf16 weights, move them forward.

`WeightReceiver.pull(v)` ends holding version v (or newer, when the publisher has moved on and
`accept_newer`), bit-identical to what the trainer published (the whole set's digest is checked
against the manifest's), or it raises. Pipelined (the default, storage/weights/apply_pipeline.py)
it decodes bucket k while the next ones are fetched, each delta into the held tensor it applies
to (in place: no tensor-sized allocation), so no second copy of the model is built; a bucket
failing its checksum is rejected whole and fetched again, and every payload must decode to its
result checksum. If the pull then fails after something was written, the receiver holds no
version (`version` None: the next pull takes a full snapshot, applied the same way). The
engine never sees any of this: it runs its own copy until the loader hands it a complete,
verified version.
A small version (the one held was at most first_read.GUESS_BYTES) has its manifest and
buckets read in one relay round trip where the relay can (storage/weights/first_read.py).
With `pipelined=False` a version is fetched and verified whole, then decoded into new tensors
swapped in at the end: a failed pull leaves what was held untouched, at twice the memory.

A delta is applied only onto its declared base (manifest base_version == the version held, and
again per payload). Otherwise (nothing held, another version held, a damaged or truncated
bucket, a bucket or manifest the relay lost) the receiver takes a full snapshot: the version
itself when it was published full, else the snapshot the publisher pushes on request
(storage/weights/snapshot_server.py: it writes the request key and waits for `full/manifest`).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from storage.delta import kernels
from storage.weights.apply_pipeline import PIPELINED, STREAMED, WHOLE, fits, pull_into
from storage.weights.buckets import CorruptBucket, Manifest
from storage.weights.first_read import Layout, read_first
from storage.cores import available_cores
from storage.relay.base import Relay, RelayKeyMissing
from storage.weights.snapshot_wait import UNUSABLE, SnapshotWait
from storage.weights.digest import tensors_digest
from storage.weights.versions import latest_version, read_manifest, request_key
from storage.weights.stream_pull import await_published

# What makes a version unusable for this receiver (the relay being down is not one of them:
# RelayError propagates, nothing is requested).


class SnapshotUnavailable(RuntimeError):
    """No full snapshot arrived in time (no publisher serving requests, or it moved on)."""


@dataclass
class PullReport:
    version: int
    mode: str  # "delta", "full" or "noop" (already held)
    base_version: int | None  # what was held before
    fallback: str = ""  # why a full snapshot was needed ("" when none was)
    bytes: int = 0  # bucket bytes fetched (including attempts that failed)
    buckets: int = 0
    rejected: int = 0  # bucket copies that failed their checksum (each fetched again)
    streamed: int = 0  # buckets applied before the manifest (storage/weights/stream_pull.py)
    polls: int = 0  # relay checks for its next bucket while streaming
    fetch_s: float = 0.0  # relay gets + bucket checksums
    apply_s: float = 0.0  # decoding and applying payloads (result checksums included)
    wait_s: float = 0.0  # waiting for a requested full snapshot
    seconds: float = 0.0
    # the relay gets alone: bytes, and seconds some get was under way (the link's get leg as
    # this receiver saw it, for the publisher's storage/weights/link_rate.LinkRate)
    get_bytes: int = 0
    get_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class WeightReceiver:
    """Holds one run's weights as last pulled; `pull` moves them to a newer version."""

    def __init__(self, relay: Relay, run: str, requester: str = "receiver",
                 batch_bytes: int = 1 << 30, full_timeout_s: float = 120.0,
                 poll_s: float = 0.05, rerequest_s: float = 2.0,
                 workers: int | None = None, pipelined: bool = True) -> None:
        """`workers`: decoding threads (None: every core this process may use); `pipelined`:
        apply while fetching, into the held dict (see the module docstring)."""
        self.relay, self.run, self.requester = relay, run, requester
        self.pipelined = pipelined
        kernels.warm_up_in_background()  # the codec's kernels, before the first delta
        self.workers = available_cores() if workers is None else max(1, workers)
        self.batch_bytes, self.full_timeout_s = batch_bytes, full_timeout_s
        self.poll_s, self.rerequest_s = poll_s, rerequest_s
        self.tensors: dict[str, torch.Tensor] | None = None
        self.version: int | None = None
        self.digest: str = ""  # tensors_digest of `tensors`
        self.broken = ""  # why `tensors` are no version (a pipelined pull failed partway)
        self._layout: Layout | None = None  # the buckets of the version held

    def pull(self, version: int | None = None, accept_newer: bool = False,
             await_s: float = 0.0) -> PullReport:
        """Hold `version` (None: the latest published) afterwards; see the module docstring.
        `await_s`: the version may not be published yet: wait up to that long for it to
        begin, and stream it if it is a delta onto the version held (stream_pull.py)."""
        t0 = time.perf_counter()
        target = version if version is not None else latest_version(self.relay, self.run)
        if target is None:
            raise RelayKeyMissing(f"no weights of run {self.run!r} in the {self.relay.name} relay")
        report = PullReport(target, "noop", self.version)
        held = self.tensors is not None and self.version is not None
        if held and self.version > target and accept_newer:
            report.version = self.version
            return report
        announced = None if held and self.version >= target or await_s <= 0 else \
            await_published(self.relay, self.run, target, await_s,
                            self.version if held else None)
        if announced is not None:  # a delta onto the version held, still being published
            try:
                self._install(target, "", None, report, "delta", announced)
            except UNUSABLE as e:  # the held weights may be half applied: a full snapshot
                self._full(target, f"streamed {type(e).__name__}: {e}", report, accept_newer)
            report.seconds = time.perf_counter() - t0
            return report
        read: dict[int, memoryview] = {}  # buckets read with the manifest, by index
        try:
            manifest, read = read_first(self.relay, self.run, target, self._layout
                                        if held and self.version < target else None)
            reason = ""
        except UNUSABLE as e:
            manifest, reason = None, f"manifest: {e}"
        if held and self.version == target:
            # Same number: held unless the relay's copy says other bits (a republished version)
            if manifest is None or manifest.meta.get("digest") in (None, self.digest):
                return report
            reason = report.fallback = f"v{target} was republished with other bits than held"
            if manifest.meta.get("kind") != "full":
                manifest = None
        if manifest is not None:
            reason = self._try_published(target, manifest, report, read)
        if reason:
            self._full(target, reason, report, accept_newer)
        report.seconds = time.perf_counter() - t0
        return report

    # -- the version as published ------------------------------------------------------------
    def _try_published(self, target: int, manifest: Manifest, report: PullReport,
                       read: dict[int, memoryview]) -> str:
        """Apply `target` as published if this receiver can; else the reason it cannot."""
        kind, base = manifest.meta.get("kind", "full"), manifest.meta.get("base_version")
        if kind == "delta":
            if self.tensors is None:
                return f"delta onto v{base}, but no weights held"
            if self.version is None:
                return f"delta onto v{base}, but the weights held are no version ({self.broken})"
            if base != self.version:
                return f"delta onto v{base}, but v{self.version} held"
        try:
            self._install(target, "", manifest, report, "delta" if kind == "delta" else "full",
                          read=read)
        except UNUSABLE as e:
            return f"{type(e).__name__}: {e}"
        return ""

    def _install(self, target: int, part: str, manifest: Manifest | None, report: PullReport,
                 mode: str, announced: dict[str, Any] | None = None,
                 read: dict[int, memoryview] | None = None) -> None:
        """Fetch, verify and decode `target`, then make it the version held; streamed as
        `announced`, before its manifest, when given. Raises before any change, except a
        pipelined or streamed pull that failed after applying some buckets (then no
        version)."""
        delta = mode == "delta"
        stats: dict[str, Any] = {}
        try:
            manifest, tensors = self._pull(target, part, manifest, delta, stats, read, announced)
        finally:  # count what crossed the wire even when the version turned out unusable
            report.bytes += int(stats.get("bytes", 0))
            report.buckets += int(stats.get("buckets", 0))
            report.rejected += int(stats.get("rejected", 0))
            report.streamed += int(stats.get("streamed", 0))
            report.polls += int(stats.get("polls", 0))
            report.fetch_s += stats.get("fetch_s", 0.0)
            report.apply_s += stats.get("decode_s", stats.get("apply_s", 0.0))
            if "gets" in stats:
                report.get_bytes += stats["gets"].bytes
                report.get_s += stats["gets"].seconds
        for name, t in tensors.items():  # decoded empties may carry odd strides: normalize
            if t.numel() == 0:
                tensors[name] = torch.empty(t.shape, dtype=t.dtype)
        if delta and set(tensors) != set(self.tensors):
            raise CorruptBucket(f"delta v{target} holds {len(tensors)} tensors, the base "
                                f"v{self.version} {len(self.tensors)}: names differ")
        t = time.perf_counter()
        digest = tensors_digest(tensors, stats.get("hashes"), self.workers)
        report.apply_s += time.perf_counter() - t
        want = manifest.meta.get("digest")
        if want is not None and digest != want:  # end to end: the whole set, bit for bit
            if stats.get("written"):  # pipelined into the held dict: it is no version now
                self.version, self.digest = None, ""
                self.broken = f"v{target} was applied but its digest was wrong"
            raise CorruptBucket(f"v{target}{'/' + part if part else ''}: weights digest "
                                f"{digest} differs from the publisher's {want}")
        # not pipelined: the only mutation, all or nothing (pipelined: `tensors` is the held dict)
        self.tensors, self.version, self.digest = tensors, target, digest
        self._layout = Layout.of(manifest)  # the guess at the next version's
        report.version, report.mode = target, mode

    def _pull(self, target: int, part: str, manifest: Manifest | None, delta: bool,
              stats: dict[str, Any], read: dict[int, memoryview] | None,
              announced: dict[str, Any] | None) -> tuple[Manifest, dict[str, torch.Tensor]]:
        """`target` through the pipeline: streamed as `announced` into the held weights;
        pipelined into the held weights' dict (a delta; a full version that fits them), or
        into a new one (nothing held, other shapes); whole into a new one."""
        mode = STREAMED if announced is not None else PIPELINED if self.pipelined else WHOLE
        dest = None if mode == WHOLE else self.tensors if announced is not None or delta \
            or fits(manifest, self.tensors) else None
        try:
            return pull_into(self.relay, self.run, target, manifest, dest,
                             base=self.tensors if delta else None,
                             base_version=self.version if delta else None, mode=mode,
                             announced=announced, part=part, workers=self.workers,
                             batch_bytes=self.batch_bytes, timeout_s=self.full_timeout_s,
                             stats=stats, read=read)
        except Exception as e:
            if stats.get("written"):  # some buckets went in, not all
                self.version, self.digest = None, ""
                self.broken = f"a streamed pull of v{target} failed: {type(e).__name__}: {e}" \
                    if announced is not None else \
                    f"a pull of v{target} failed partway: {type(e).__name__}: {e}"
            raise

    # -- full snapshot fallback --------------------------------------------------------------
    def _full(self, target: int, reason: str, report: PullReport, accept_newer: bool) -> None:
        report.fallback = reason
        t0 = time.perf_counter()
        bad: set[tuple[str, int, Any]] = set()  # snapshots found damaged: not fetched again

        def attempt() -> tuple[bool | None, bool]:
            nonlocal target  # a newer version once it is the newest (accept_newer)
            done, newest, new_damage = self._try_full(target, report, accept_newer, bad)
            news, target = newest != target or new_damage, newest
            return (True if done else None), news

        def ask() -> None:
            self._ask(target, reason, [at for part, v, at in bad if part == "full" and v == target])

        def give_up(relay_error: str) -> SnapshotUnavailable:
            return SnapshotUnavailable(
                f"run {self.run!r}: no usable full snapshot of v{target} within "
                f"{self.full_timeout_s:g} s (is the publisher serving requests?); "
                f"needed because {reason}{relay_error}")

        SnapshotWait(self.full_timeout_s, self.rerequest_s, self.poll_s).until(attempt, ask, give_up)
        report.wait_s = time.perf_counter() - t0 - report.fetch_s - report.apply_s

    def _try_full(self, target: int, report: PullReport, accept_newer: bool,
                  bad: set) -> tuple[bool, int, bool]:
        """One look for a usable full snapshot; (installed, target, new damage seen)."""
        newest = latest_version(self.relay, self.run) if accept_newer else None
        if newest is not None and newest > target:
            target = newest  # only the newest can be served
        new_damage = False
        for part in ("", "full"):  # a version (re)published in full, or the snapshot
            try:
                manifest = read_manifest(self.relay, self.run, target, part)
            except RelayKeyMissing:
                continue
            except CorruptBucket:  # an unreadable manifest: the publisher pushes again
                new_damage = True
                continue
            tag = (part, target, manifest.meta.get("published_at"))
            if manifest.meta.get("kind", "full") != "full" or tag in bad:
                continue
            try:
                self._install(target, part, manifest, report, "full")
                return True, target, new_damage
            except UNUSABLE as e:
                bad.add(tag)
                new_damage = True
                report.fallback += f"; full snapshot unusable: {e}"
        return False, target, new_damage

    def _ask(self, version: int, reason: str, damaged: list) -> None:
        """Request a full snapshot of `version`; `damaged` lists the published_at stamps of
        snapshots found unusable, which the publisher then replaces (and only those)."""
        body = {"version": version, "by": self.requester, "reason": reason[:500],
                "damaged": damaged, "at": time.time()}
        self.relay.put(request_key(self.run, version), json.dumps(body).encode())
