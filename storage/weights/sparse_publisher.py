"""The trainer's side of sparse publishing: full snapshot first, then per-tensor deltas.

The publisher keeps a bf16 copy of what it last published (version v). Publishing v+1 encodes
each tensor with storage.delta against that copy (the codec picks the smallest of its sparse
encodings, or dense); every payload carries base and target version, shape, dtype and the
result's checksum, and the manifest says kind "delta" with its base version. A full snapshot
(kind "full", every payload dense) goes out when there is no base: the first publish, a
version that does not follow the last one (a re-publish, a restart), a changed set of tensors.

Receivers that cannot apply a delta ask for a full snapshot of the held version: the
publisher's `snapshots` (storage/weights/snapshot_server.py) push it on request, from a thread
on the trainer (`start_server`), and put the held version back if the relay lost it.

With a link rate (`link_gbps`), a delta's tensors are chosen by time, not bytes
(storage/delta/time_model.py): a tensor goes raw (its bytes as they are, encoding "raw") when
that reaches the receiver sooner, judged before the change scan (tiny tensors, fast links)
and again once its best encoding's size is known. Given a `link_rate`, the rate is what the
transfers measure once they have (storage/weights/link_rate.py): this publisher's bucket
puts, and the receivers' gets handed to `observe_gets`; `link_gbps` until then. With
`measure_cpu`, the model's CPU costs are this host's, probed once per process
(storage/delta/host_speed.py), not those fitted on the project's VM. Tensors are
encoded by a pool of `workers` threads (storage/weights/parallel.py); the receiver decodes
with its own.
"""
from __future__ import annotations

import threading
import time
from typing import Any

import torch

from storage.weights.buckets import DEFAULT_BUCKET_BYTES, BucketInfo
from storage.delta import host_speed, kernels, time_model
from storage.relay.base import Buffer, Relay
from storage.cores import available_cores
from storage.weights.coder_processes import (CoderError, CoderProcesses, HandedOut,
                                              shared_coders)
from storage.weights.parallel import busy_workers
from storage.weights.digest import raw_entry_hashes, tensors_digest
from storage.weights.link_rate import LinkRate
from storage.weights.piece_coder import code_piece
from storage.weights.tensor_arena import ArenaSlots, arena_copy, arena_of
from storage.weights.tensor_form import (RawSamples, all_raw, raw_unseen, record_raw,
                                         record_tensor, streaming_order)
from storage.weights.transfer_metrics import PublishReport
from storage.weights.snapshot_server import SnapshotServer
from storage.weights.spans import Span, SpanHashes, flat_range, hashes_of_raw, pieces
from storage.weights.payloads import raw_encoder
from storage.weights.publisher import publish_weights


def _kept(tensor: torch.Tensor, copy: bool) -> torch.Tensor:
    """What the publisher keeps of a tensor as the next base: a contiguous CPU copy, or the
    tensor itself when it already is one and `copy` is off (no per-tensor op: it adds up on a
    model of hundreds of small tensors)."""
    if not copy and tensor.device.type == "cpu" and not tensor.requires_grad \
            and tensor.is_contiguous():
        return tensor
    held = tensor.detach().to("cpu")
    return held.clone(memory_format=torch.contiguous_format) if copy else held.contiguous()


class SparsePublisher:
    """Publishes versions of one run through one relay; see the module docstring."""

    def __init__(self, relay: Relay, run: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 sparse: bool = True, link_gbps: float | None = None,
                 workers: int | None = None, part: str = "", stream: bool = True,
                 link_rate: LinkRate | None = None, measure_cpu: bool = False,
                 raw_samples: RawSamples | None = None, coder_processes: int = 0) -> None:
        """`link_gbps`: choose each tensor's form by predicted time over that link (None: by
        bytes alone), or by what `link_rate` measures once it has (it may be shared: the
        parts of a sharded version, storage/weights/sharded_publisher.py);
        `workers`: encoding threads (None: every core this process may use);
        `part`: publish under that sub-prefix of each version, leaving `latest` alone (one
        part of a version another commits: storage/weights/sharded_publisher.py); `stream`: announce
        coded deltas so receivers apply them bucket by bucket (storage/weights/stream_pull.py);
        `measure_cpu`: cost coding at this host's probed speed, not COSTS as fitted;
        `raw_samples`: the judge's samples that found raw so far (it may be shared: the
        publishers of one run over time), else a fresh record kept across this one's publishes;
        `coder_processes`: code a delta's pieces in that many processes, not on this process's
        threads alone (storage/weights/coder_processes.py; 0: threads)."""
        self.relay, self.run, self.bucket_bytes, self.sparse = relay, run, bucket_bytes, sparse
        self.part, self.stream = part, stream
        self.link_gbps = link_gbps
        self.link_rate, self.measure_cpu = link_rate, measure_cpu
        if sparse:  # compile the codec's kernels before the first publish needs them
            kernels.warm_up_in_background()
        self.workers = available_cores() if workers is None else max(1, workers)
        self.version: int | None = None
        self._held: dict[str, torch.Tensor] | None = None
        # (version, its tensors, why full, all raw?, link) as streams() found it, for the publish
        self._plan: tuple[int, dict[str, torch.Tensor], str, bool,
                          time_model.Link | None] | None = None
        self._lock = threading.RLock()  # publish and the snapshot server share the held copy
        # the run's versions in the relay as this publisher's last push left them: it is the
        # run's only publisher, so it need not ask the relay again (None: ask)
        self._relay_versions: frozenset[int] | None = None
        self._raw_samples = raw_samples or RawSamples()  # kept from publish to publish
        self.coders: CoderProcesses | None = coder_processes and shared_coders(coder_processes) or None
        self._held_arena: ArenaSlots | None = None  # where _held is for the coders, if anywhere
        self.snapshots = SnapshotServer(relay, run, part, self._lock,
                                        lambda: (self.version, self._held), self._push_full)

    @property
    def held(self) -> dict[str, torch.Tensor] | None:
        return self._held

    def start_server(self, interval_s: float = 0.1) -> None:
        """Answer requests for full snapshots from a daemon thread until stop_server."""
        self.snapshots.start(interval_s)

    def stop_server(self) -> None:
        self.snapshots.stop()

    def _full_reason(self, version: int, tensors: dict[str, torch.Tensor]) -> str:
        if not self.sparse:
            return "sparse publishing off"
        if self._held is None:
            return "first snapshot"
        if version != self.version + 1:
            return f"v{version} does not follow the last published v{self.version}"
        if {n: (t.shape, t.dtype) for n, t in tensors.items()} != \
                {n: (t.shape, t.dtype) for n, t in self._held.items()}:
            return "tensor names, shapes or dtypes changed"
        return ""

    def streams(self, version: int, tensors: dict[str, torch.Tensor]) -> bool:
        """Whether publish(version, tensors) streams: a coded delta, announced before its
        buckets, which receivers apply as it lands if they wait for it before it starts.
        Otherwise (a full snapshot, a delta all sent raw) there is nothing to overlap and they
        had better pull once it is complete, as from the dense path: a receiver polling the
        relay meanwhile only takes CPU from the push. The verdict is kept for that publish."""
        with self._lock:
            reason, raw, _ = self._judge(version, tensors)
            return self._streamed(not reason, raw, self.part)

    def _streamed(self, delta: bool, raw: bool, part: str) -> bool:
        """A coded delta of the whole version is streamed; see streams()."""
        return delta and not raw and not part and self.stream

    def _judge(self, version: int, tensors: dict[str, torch.Tensor]
               ) -> tuple[str, bool, time_model.Link | None]:
        """(why `version` goes out full, "" for a delta; whether the delta goes all raw:
        tensor_form.all_raw against the held base; the link its tensors are chosen for, None
        for a full snapshot or without a link rate), once per (version, tensors)."""
        if self._plan is None or self._plan[0] != version or self._plan[1] is not tensors:
            reason = self._full_reason(version, tensors)
            link = None if reason or self.link_gbps is None else self._link(tensors)
            raw = link is not None and all_raw(tensors, self._held, link, self._raw_samples)
            self._plan = (version, tensors, reason, raw, link)
        return self._plan[2], self._plan[3], self._plan[4]

    def _link(self, tensors: dict[str, torch.Tensor]) -> time_model.Link:
        """The link, the cores coding these tensors keeps busy (threads or coder processes; a
        model that fits in one pool task, the demo policy's 1.7 MB, on one whatever the
        machine) and their speed."""
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        gbps = self.link_gbps if self.link_rate is None else self.link_rate.gbps(self.link_gbps)
        speed = host_speed.measured() if self.measure_cpu else time_model.HostSpeed()
        coding = self.coders.count if self.coders is not None else self.workers
        return time_model.Link(gbps, busy_workers(total, coding), speed)

    def observe_gets(self, nbytes: int, seconds: float) -> bool:
        """A receiver's pull took `seconds` of relay gets for `nbytes` (its PullReport's
        get_bytes and get_s): the get leg of the measured link (without a `link_rate`,
        ignored); False when not counted (too small to tell the bandwidth)."""
        return self.link_rate is not None and self.link_rate.observe("get", nbytes, seconds)

    def publish(self, version: int, tensors: dict[str, torch.Tensor],
                copy: bool = True) -> PublishReport:
        """Push `version`: a delta against the last published version when possible, else full.
        Keeps `tensors` as the next base (only once the manifest is in the relay): a copy, or
        the tensors themselves with copy=False (the caller then never modifies them, as with
        Trainer.weights_bf16, which builds fresh ones)."""
        with self._lock:
            reason, raw, link = self._judge(version, tensors)
            base = None if reason else self._held
            # with coder processes, the version where they read it: as it is when the trainer
            # took it in an arena (TensorArena.of), else copied into one (where there is room)
            shared, where = tensors, None if copy or self.coders is None else arena_of(tensors)
            if self.coders is not None and where is None and \
                    (copied := arena_copy(tensors)) is not None:
                shared, where = copied, arena_of(copied)
            report = self._push(version, tensors, base, reason, self.part, compare=self._held,
                                raw=raw, link=link, arena=where)
            self._held = shared if where is not None else \
                {n: _kept(t, copy) for n, t in tensors.items()}
            self._held_arena = where
            self.version, self._plan = version, None
            return report

    def _hand_out(self, order: dict[str, torch.Tensor], base: dict[str, torch.Tensor] | None,
                  new: ArenaSlots | None, raw: bool,
                  link: time_model.Link | None, base_version: int | None, version: int,
                  split: bool) -> HandedOut:
        """A coded delta's pieces handed to the coder processes, where they are up and both
        versions are in arenas (none handed out: this process's threads code them all)."""
        old = None if new is None or base is None or raw or not self.coders.ready() \
            else self._held_arena  # base is the held version
        try:
            if old is not None:
                return self.coders.hand_out(pieces(order, split), new, old, link, base_version,
                                            version, lambda t, span: raw_unseen(t, span, link))
        except CoderError:  # gone (said loudly once): the threads code this publish
            pass
        return HandedOut(None, {})

    def _push_full(self, version: int, tensors: dict[str, torch.Tensor], reason: str,
                   part: str) -> PublishReport:
        return self._push(version, tensors, None, reason, part)

    def _push(self, version: int, tensors: dict[str, torch.Tensor],
              base: dict[str, torch.Tensor] | None, reason: str, part: str = "",
              compare: dict[str, torch.Tensor] | None = None, raw: bool = False,
              link: time_model.Link | None = None,
              arena: ArenaSlots | None = None) -> PublishReport:
        """Encode against `base` (None: full) and push; densities are counted against
        `compare` (the previous version) when given, else every element counts as sent.
        `raw`: the delta goes all raw, sent as the dense path sends it; `link`: what each
        tensor is chosen by time for (both from _judge; a full snapshot needs neither);
        `arena`: where the version is in shared memory, for coder processes to code it against the base's
        (None, or either not in one, or the coders not up: this process's threads code).
        The digest and the stats of a delta sent raw are taken once every tensor is encoded,
        while the last buckets are put (publish_weights' meta), not after them."""
        t0 = time.perf_counter()
        kind = "full" if base is None else "delta"
        base_version = None if base is None else self.version
        report = PublishReport(version, kind, base_version, reason, part,
                               link_gbps=None if link is None else link.gbps,
                               cpu_speed=None if link is None else link.speed.as_dict())
        hashes: dict[str, int] = {}  # per tensor, for the digest: no second pass over the model
        span_hashes, spanned = SpanHashes(), set()  # large tensors sent as blocks (spans.py)

        def encoder(name: str, tensor: torch.Tensor, span: Span | None = None
                    ) -> tuple[Buffer, dict[str, Any]]:
            old = None if base is None else base[name]
            piece = coded.get(name, span)  # None: not handed to a coder process
            # its encode_s: the coder's coding time, not the wait for it; else this thread's
            t, elsewhere = time.perf_counter(), 0.0 if piece is None else piece.seconds
            ref = compare  # what its changes are counted against
            if span is not None:  # one block of a large tensor (storage/weights/spans.py)
                tensor, old = flat_range(tensor, span), flat_range(old, span)
                ref = {name: flat_range(compare[name], span)} if compare else compare
            if piece is None:  # (or its coder failed: then the error is raised here)
                piece = code_piece(name, tensor, old, link, base_version, version)
            if piece.checksum is not None:  # = tensor_hash(tensor), for the digest
                if span is None:
                    hashes[name] = piece.checksum
                else:
                    span_hashes.add(name, span[0], piece.checksum)
            data, meta = raw_encoder(name, tensor) if piece.payload is None \
                else (piece.payload, {"encoding": "rsdt"})
            record_tensor(report, ref, name, tensor, piece.encoding, memoryview(data).nbytes,
                          piece.changed, elsewhere + time.perf_counter() - t)
            if span is not None:
                spanned.add(name)
            return data, meta

        digest_s = 0.0

        def manifest_meta(infos: list[BucketInfo]) -> dict[str, Any]:  # every tensor encoded
            nonlocal digest_s
            t = time.perf_counter()
            hashes_of_raw((e for b in infos for e in b.entries), span_hashes)
            report.digest = tensors_digest(tensors, {**raw_entry_hashes(infos), **hashes,
                                                     **span_hashes.tensors()}, self.workers)
            digest_s = time.perf_counter() - t
            if raw:  # as the dense path publishes: no per-tensor work beyond the stats
                record_raw(report, base, tensors)
            return {"kind": kind, "base_version": base_version, "reason": reason,
                    "digest": report.digest}
        # a coded delta is streamed: receivers holding its base apply each bucket as it lands,
        # and its buckets close by the dense bytes they rewrite, so there are several to overlap
        streamed = self._streamed(kind == "delta", raw, part)
        known = None if part else self._relay_versions
        if not part:  # until this push is through: a failed one may have pruned some
            self._relay_versions = None
        order = tensors if kind == "full" or raw else streaming_order(tensors)
        coded = self._hand_out(order, base, arena, raw, link, base_version, version, streamed)
        stats = publish_weights(self.relay, self.run, version, order, self.bucket_bytes,
                                raw_encoder if raw else encoder, manifest_meta, part,
                                workers=1 if coded else link.cores if link else self.workers,
                                announce={"kind": kind, "base_version": base_version}
                                if streamed else None, work=streamed,
                                held_versions=known, split=streamed)
        if not part:
            self._relay_versions = stats.held_versions
        report.coders = self.coders.count if coded else 0
        report.merge_spans(spanned, tensors, compare)
        report.encode_s = sum(t.encode_s for t in report.tensors) + digest_s
        report.pushed_bytes, report.buckets = stats.bytes, stats.buckets
        report.seconds = time.perf_counter() - t0
        report.push_s = stats.push_s  # relay puts and pruning (encode_s sums threads)
        if self.link_rate is not None:
            self.link_rate.observe("put", stats.put_bytes, stats.put_s)
        return report
