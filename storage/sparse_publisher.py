"""The trainer's side of sparse publishing: full snapshot first, then per-tensor deltas.

The publisher keeps a bf16 copy of what it last published (version v). Publishing v+1 encodes
each tensor with storage.delta against that copy (the codec picks the smallest of its sparse
encodings, or dense); every payload carries base and target version, shape, dtype and the
result's checksum, and the manifest says kind "delta" with its base version. A full snapshot
(kind "full", every payload dense) goes out when there is no base: the first publish, a
version that does not follow the last one (a re-publish, a restart), a changed set of tensors.

Receivers that cannot apply a delta (no base, another base, a damaged or lost bucket, a relay
that lost its objects) ask for a full snapshot; the design chosen here is republish on request:
  - the receiver writes `rose/<run>/v<v>/full-request` (weight_publisher.request_key);
  - `serve_requests` (polled by a thread on the trainer, `start_server`) pushes a full snapshot
    of the held version under `rose/<run>/v<v>/full/` and removes the request. It pushes again
    only if the request says the snapshot there was damaged;
  - it also checks that the held version's manifest is still in the relay; if the relay lost it
    (Mooncake master restart, eviction) it republishes that version in full, under its own key.
Only the held (newest) version can be served: a receiver further behind takes the newest.
No full snapshot is pushed unless someone needs it, so steady-state pushes stay sparse.
"""
from __future__ import annotations

import json
import logging
import struct
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import xxhash

from storage.buckets import DEFAULT_BUCKET_BYTES
from storage.delta import encode_delta, read_header
from storage.delta.bits import DTYPE_CODES, to_bits
from storage.relay import Buffer, Relay, RelayError, RelayKeyMissing
from storage.shard_layout import layer_index
from storage.weight_publisher import (manifest_key, publish_weights, raw_encoder, read_manifest,
                                      request_key)

log = logging.getLogger("rose.publish")
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class TensorStat:
    name: str
    layer: int  # transformer layer index; -1 for embeddings, final norm, head
    numel: int
    changed: int  # elements whose bits differ from the base (numel when there is none)
    encoding: str  # storage.delta encoding chosen (dense, ef, ternary, xor_zstd, coo) or raw
    raw_bytes: int
    encoded_bytes: int
    encode_s: float

    @property
    def density(self) -> float:
        return self.changed / self.numel if self.numel else 0.0


@dataclass
class PublishReport:
    version: int
    kind: str  # "full" or "delta"
    base_version: int | None
    reason: str  # why full ("" for a delta)
    part: str = ""  # "" = the version itself, "full" = a snapshot pushed on request
    digest: str = ""  # tensors_digest of the version: receivers check what they assemble
    pushed_bytes: int = 0  # bucket bytes put into the relay
    buckets: int = 0
    encode_s: float = 0.0
    push_s: float = 0.0
    seconds: float = 0.0
    tensors: list[TensorStat] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Step-level numbers (JSON-able): sizes, density overall and per layer, timings."""
        raw = sum(t.raw_bytes for t in self.tensors)
        numel = sum(t.numel for t in self.tensors)
        changed = sum(t.changed for t in self.tensors)
        layers: dict[int, list[int]] = {}
        encodings: dict[str, int] = {}
        for t in self.tensors:
            acc = layers.setdefault(t.layer, [0, 0])
            acc[0] += t.changed
            acc[1] += t.numel
            encodings[t.encoding] = encodings.get(t.encoding, 0) + 1
        return {"version": self.version, "kind": self.kind, "base_version": self.base_version,
                "reason": self.reason, "digest": self.digest, "tensors": len(self.tensors), "raw_bytes": raw,
                "encoded_bytes": self.pushed_bytes, "buckets": self.buckets,
                "compression": raw / self.pushed_bytes if self.pushed_bytes else 0.0,
                "numel": numel, "changed": changed, "density": changed / numel if numel else 0.0,
                "density_per_layer": {str(k): c / n if n else 0.0
                                      for k, (c, n) in sorted(layers.items())},
                "encodings": encodings, "encode_s": self.encode_s, "push_s": self.push_s,
                "publish_s": self.seconds}

    def rows(self) -> list[dict[str, Any]]:
        return [{**asdict(t), "density": t.density} for t in self.tensors]


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """Order-independent xxh3-64 of names and exact bit patterns (the same value as
    executors.rollout_worker.weights_digest): equal digests = bit-identical weights."""
    h = xxhash.xxh3_64()
    for name in sorted(tensors):
        h.update(name.encode())
        t = tensors[name]
        if t.numel():
            h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def changed_in_payload(payload: Buffer) -> int | None:
    """The change count a coo or ef payload states (its body starts with it: coo = u64 count,
    ef = u64 length + Elias-Fano header u64 count; storage/delta/encodings.py), saving a
    compare pass; None for other encodings."""
    head = read_header(payload)
    body = memoryview(payload)[head.header_length:]
    if head.encoding == "coo" and len(body) >= 8:
        return struct.unpack_from("<Q", body, 0)[0]
    if head.encoding == "ef" and len(body) >= 16:
        return struct.unpack_from("<Q", body, 8)[0]
    return None


def changed_count(new: torch.Tensor, base: torch.Tensor) -> int:
    """Elements whose bit patterns differ (NaN payloads, -0 and +0 count as different)."""
    if new.numel() == 0:
        return 0
    if new.dtype in DTYPE_CODES:  # numpy compares + counts ~3x faster than torch on one thread
        return int(np.count_nonzero(to_bits(new) != to_bits(base)))
    ints = _INT_OF_WIDTH[new.element_size()]
    return int(torch.count_nonzero(new.reshape(-1).view(ints) != base.reshape(-1).view(ints)))


class SparsePublisher:
    """Publishes versions of one run through one relay; see the module docstring."""

    def __init__(self, relay: Relay, run: str, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 sparse: bool = True) -> None:
        self.relay, self.run, self.bucket_bytes, self.sparse = relay, run, bucket_bytes, sparse
        self.version: int | None = None
        self._held: dict[str, torch.Tensor] | None = None
        self._lock = threading.RLock()  # publish and serve_requests share the held copy
        self._stop: threading.Event | None = None
        self.served: list[PublishReport] = []  # full snapshots pushed by serve_requests

    @property
    def held(self) -> dict[str, torch.Tensor] | None:
        return self._held

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

    def publish(self, version: int, tensors: dict[str, torch.Tensor],
                copy: bool = True) -> PublishReport:
        """Push `version`: a delta against the last published version when possible, else full.
        Keeps `tensors` as the next base (only once the manifest is in the relay): a copy, or
        the tensors themselves with copy=False (the caller then never modifies them, as with
        Trainer.weights_bf16, which builds fresh ones)."""
        with self._lock:
            reason = self._full_reason(version, tensors)
            base = None if reason else self._held
            report = self._push(version, tensors, base, reason, compare=self._held)
            held = {n: t.detach().to("cpu") for n, t in tensors.items()}
            self._held = {n: t.clone(memory_format=torch.contiguous_format) if copy
                          else t.contiguous() for n, t in held.items()}
            self.version = version
            return report

    def _push(self, version: int, tensors: dict[str, torch.Tensor],
              base: dict[str, torch.Tensor] | None, reason: str, part: str = "",
              compare: dict[str, torch.Tensor] | None = None) -> PublishReport:
        """Encode against `base` (None: full) and push; densities are counted against
        `compare` (the previous version) when given, else every element counts as sent."""
        t0 = time.perf_counter()
        kind = "full" if base is None else "delta"
        base_version = None if base is None else self.version
        report = PublishReport(version, kind, base_version, reason, part)

        def encoder(name: str, tensor: torch.Tensor) -> tuple[Buffer, dict[str, Any]]:
            t = time.perf_counter()
            old = None if base is None else base[name]
            changed = None
            if tensor.dtype in DTYPE_CODES:
                data: Buffer = encode_delta(tensor, old, name=name, base_version=base_version,
                                            target_version=version)
                meta, encoding = {"encoding": "rsdt"}, read_header(data).encoding
                if old is not None:
                    changed = changed_in_payload(data)
            else:  # a dtype the codec does not know: its raw bytes, always whole
                data, meta = raw_encoder(name, tensor)
                encoding = "raw"
            ref = None if compare is None else compare.get(name)
            same = ref is not None and ref.shape == tensor.shape and ref.dtype == tensor.dtype
            if changed is None:
                changed = changed_count(tensor, ref) if same else tensor.numel()
            layer = layer_index(name)
            report.tensors.append(TensorStat(
                name, -1 if layer is None else layer, tensor.numel(), changed, encoding,
                tensor.numel() * tensor.element_size(), memoryview(data).nbytes,
                time.perf_counter() - t))
            return data, meta

        t = time.perf_counter()
        report.digest = tensors_digest(tensors)
        digest_s = time.perf_counter() - t
        stats = publish_weights(self.relay, self.run, version, tensors, self.bucket_bytes,
                                encoder, {"kind": kind, "base_version": base_version,
                                          "reason": reason, "digest": report.digest}, part)
        report.encode_s = sum(t.encode_s for t in report.tensors) + digest_s
        report.pushed_bytes, report.buckets = stats.bytes, stats.buckets
        report.seconds = time.perf_counter() - t0
        report.push_s = report.seconds - report.encode_s
        return report

    # -- full snapshots on request ----------------------------------------------------------
    def serve_requests(self, check_lost: bool = True) -> PublishReport | None:
        """One pass: republish the held version if the relay lost it (`check_lost`); answer a
        request for a full snapshot of it. Returns what was pushed, if anything."""
        with self._lock:
            if self._held is None:
                return None
            v = self.version
            if check_lost and not self.relay.exists(manifest_key(self.run, v)):
                log.warning("relay %s lost v%d of run %s: republishing it in full",
                            self.relay.name, v, self.run)
                report = self._push(v, self._held, None, "relay lost the published version")
                self.served.append(report)
                return report
            if not self.relay.exists(request_key(self.run, v)):  # cheaper than a missing get
                return None
            try:
                request = json.loads(self.relay.get(request_key(self.run, v)))
            except RelayKeyMissing:
                return None
            except ValueError:  # a torn or foreign value: treat as a plain request
                request = {}
            report = None
            if request.get("damaged") or not self._full_snapshot_present(v):
                reason = f"requested by {request.get('by', '?')}: {request.get('reason', '')}"
                report = self._push(v, self._held, None, reason.strip(), part="full")
                self.served.append(report)
            self.relay.remove(request_key(self.run, v))
            return report

    def _full_snapshot_present(self, version: int) -> bool:
        try:
            read_manifest(self.relay, self.run, version, "full")
            return True
        except (RelayKeyMissing, ValueError):  # absent, or a damaged manifest: push again
            return False

    def start_server(self, interval_s: float = 0.1) -> None:
        """Serve requests from a daemon thread until stop_server (idempotent)."""
        if self._stop is not None:
            return
        self._stop = stop = threading.Event()

        def loop() -> None:
            backoff, passes = interval_s, 0
            while not stop.wait(backoff):
                try:  # a lost version is rarer than a request: look for it about once a second
                    self.serve_requests(check_lost=passes % max(1, round(1 / interval_s)) == 0)
                    backoff, passes = interval_s, passes + 1
                except (RelayError, OSError) as e:  # relay down (master restarting): retry
                    log.warning("full-snapshot server of run %s: %s", self.run, e)
                    backoff = min(2.0, backoff * 2)
                except Exception:  # never let the thread die silently
                    log.exception("full-snapshot server of run %s failed a pass", self.run)
                    backoff = min(2.0, backoff * 2)

        threading.Thread(target=loop, name=f"rose-snapshots-{self.run}", daemon=True).start()

    def stop_server(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
