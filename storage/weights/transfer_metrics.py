"""Weight transfer metrics: what a publish measured (PublishReport: per tensor and per step),
and per step a small Parquet file, one row per published tensor.

    <data>/runs/<run>/transfer/step=<n>.parquet

Each row: the tensor (name, layer, numel, changed elements, density, encoding chosen, raw and
encoded bytes, encode seconds) and, repeated, the step's publish (kind full/delta, base
version, bucket bytes pushed, push and publish seconds, the link rate its tensors were chosen
by: configured or measured, storage/weights/link_rate.py) and the pulls waited for (slowest pull,
apply and engine load seconds, full-snapshot fallbacks; the workers not waited for, each
with why: left out as gone, restarting or silent, or skipped with no engine or a pull that
could not start). Query with duckdb, e.g.
    SELECT step, layer, sum(changed) / sum(numel) AS density
    FROM read_parquet('<run>/transfer/*.parquet') GROUP BY ALL ORDER BY ALL
"""
from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from storage.atomic import atomic_path
from storage.delta import DeltaHeader, blocks, read_header
from storage.delta.bits import DTYPE_CODES, to_bits
from storage.relay.base import Buffer

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
    kind: str  # "full" or "delta" ("mixed": parts of a sharded version that differ)
    base_version: int | None
    reason: str  # why full ("" for a delta)
    part: str = ""  # "" = the version itself, "full" = a snapshot pushed on request
    digest: str = ""  # tensors_digest of the version: receivers check what they assemble
    pushed_bytes: int = 0  # bucket bytes put into the relay
    buckets: int = 0
    encode_s: float = 0.0
    push_s: float = 0.0
    seconds: float = 0.0
    # the link rate its tensors were chosen by (None: a full snapshot, or chosen by bytes)
    link_gbps: float | None = None
    # this host's coding speed against the time model's costs, method -> [encode, apply]
    # (storage/delta/host_speed.py; None: the costs as fitted, or not chosen by time)
    cpu_speed: dict[str, list[float]] | None = None
    coders: int = 0  # coder processes its pieces were handed to (0: this process's threads)
    # a version pushed by several trainer ranks: bucket bytes each pushed ("r<tp>.<pp>.<dp>")
    rank_bytes: dict[str, int] | None = None
    tensors: list[TensorStat] = field(default_factory=list)
    # (stat, new, base) whose change count is taken when the report is read: a compare pass
    # over every tensor sent raw or ternary would otherwise sit between encode and push
    _deferred: list = field(default_factory=list, repr=False, compare=False)

    def defer_changed(self, stat: TensorStat, new: torch.Tensor, base: torch.Tensor) -> None:
        self._deferred.append((stat, new, base))

    def merge_spans(self, names: set[str], new: dict[str, torch.Tensor],
                    base: dict[str, torch.Tensor] | None) -> None:
        """One row for each of `names`, recorded block by block (storage/weights/spans.py):
        sizes and seconds summed, its encoding the one covering most of it; a change count
        left for later in any block is taken later over the whole tensor."""
        if not names:
            return
        self.tensors, merged = _merged(self.tensors, names)
        later = {t.name for t, _, _ in self._deferred if t.name in names}
        self._deferred = [d for d in self._deferred if d[0].name not in names]
        self._deferred += [(merged[n], new[n], base[n]) for n in sorted(later) if base]

    def _resolve(self) -> None:
        while self._deferred:
            stat, new, base = self._deferred.pop()
            stat.changed = changed_count(new, base)

    def summary(self) -> dict[str, Any]:
        """Step-level numbers (JSON-able): sizes, density overall and per layer, timings."""
        self._resolve()
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
                "publish_s": self.seconds, "link_gbps": self.link_gbps,
                "cpu_speed": self.cpu_speed, "coders": self.coders, "rank_bytes": self.rank_bytes}

    @classmethod
    def combine(cls, version: int, parts: list["PublishReport"], digest: str,
                seconds: float) -> "PublishReport":
        """One report for a version pushed as parts (storage/weights/sharded_publisher.py): kind "mixed"
        when its parts differ, sizes and encode/push times summed, change counts still deferred."""
        kinds = sorted({r.kind for r in parts})
        bases = {r.base_version for r in parts}
        out = cls(version, kinds[0] if len(kinds) == 1 else "mixed",
                  bases.pop() if len(bases) == 1 else None,
                  "; ".join(sorted({r.reason for r in parts if r.reason})), digest=digest,
                  seconds=seconds)
        links = {r.link_gbps for r in parts}  # one link: the parts share its measured rate
        out.link_gbps = links.pop() if len(links) == 1 else None
        out.cpu_speed = next((r.cpu_speed for r in parts if r.cpu_speed), None)  # one host
        out.coders = max((r.coders for r in parts), default=0)  # the parts share one pool
        for r in parts:
            out.pushed_bytes, out.buckets = out.pushed_bytes + r.pushed_bytes, out.buckets + r.buckets
            out.encode_s, out.push_s = out.encode_s + r.encode_s, out.push_s + r.push_s
            out.tensors += r.tensors
            out._deferred += r._deferred
        return out

    def rows(self) -> list[dict[str, Any]]:
        self._resolve()
        return [{**asdict(t), "density": t.density} for t in self.tensors]


def _merged(rows: list[TensorStat], names: set[str]
            ) -> tuple[list[TensorStat], dict[str, TensorStat]]:
    """`rows` with the rows of each of `names` summed into one, where its first one was (and
    those merged rows by name); its encoding the one that covered most of its elements."""
    out: list[TensorStat] = []
    first: dict[str, TensorStat] = {}
    cover: dict[str, dict[str, int]] = {}
    for t in rows:
        if t.name not in names:
            out.append(t)
            continue
        by = cover.setdefault(t.name, {})
        by[t.encoding] = by.get(t.encoding, 0) + t.numel
        if t.name not in first:
            first[t.name] = TensorStat(**asdict(t))
            out.append(first[t.name])
            continue
        m = first[t.name]
        m.numel, m.changed = m.numel + t.numel, m.changed + t.changed
        m.raw_bytes, m.encoded_bytes = m.raw_bytes + t.raw_bytes, m.encoded_bytes + t.encoded_bytes
        m.encode_s += t.encode_s
    for name, m in first.items():
        m.encoding = max(cover[name], key=cover[name].__getitem__)
    return out, first


def changed_in_payload(payload: Buffer, head: DeltaHeader | None = None) -> int | None:
    """The change count a coo or ef payload states (its body starts with it: coo = u64 count,
    ef = u64 length + Elias-Fano header u64 count; storage/delta/encodings.py), saving a
    compare pass; summed over the blocks of one in blocks; None for other encodings. `head`:
    its read_header, when the caller has it."""
    head = read_header(payload) if head is None else head
    body = memoryview(payload)[head.header_length:]
    if head.encoding == "blocks":
        counts = [changed_in_payload(sub) for _, _, sub in blocks.unpack(body, head.numel)]
        return None if None in counts else sum(counts)  # type: ignore[arg-type]
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



SCHEMA = pa.schema([
    ("step", pa.int64()), ("version", pa.int64()), ("kind", pa.string()),
    ("base_version", pa.int64()), ("reason", pa.string()),
    ("name", pa.string()), ("layer", pa.int64()), ("numel", pa.int64()),
    ("changed", pa.int64()), ("density", pa.float64()), ("encoding", pa.string()),
    ("raw_bytes", pa.int64()), ("encoded_bytes", pa.int64()), ("encode_s", pa.float64()),
    ("pushed_bytes", pa.int64()), ("push_s", pa.float64()), ("publish_s", pa.float64()),
    ("pull_s_max", pa.float64()), ("apply_s_max", pa.float64()), ("load_s_max", pa.float64()),
    ("pulled_bytes_max", pa.int64()), ("workers_synced", pa.int64()),
    ("full_fallbacks", pa.int64()),
    # the workers the publish went on without, "name: why; ..." (columns added later: a run's
    # older files lack them, read as null by the catalog's union_by_name view)
    ("workers_left_out", pa.string()), ("workers_skipped", pa.string()),
    ("link_gbps", pa.float64()),  # the rate the tensors were chosen by (null: full, by bytes)
    # JSON {method: [encode, apply]}: the trainer host's coding speed against the time model's
    # fitted costs (storage/delta/host_speed.py; null: the costs as fitted, or a full snapshot)
    ("cpu_speed", pa.string()),
    # coder processes the delta's pieces were handed to (publish.coder_processes; 0: coded on
    # the trainer's threads, also where /dev/shm had no room). encode_s is coding time either way
    ("coders", pa.int64()),
    # JSON {"r<tp>.<pp>.<dp>": bytes} of a version pushed by a trainer group, else null
    ("rank_bytes", pa.string()),
    # JSON {worker: bytes} each engine pulled of this version
    ("worker_pulled_bytes", pa.string()),
])


def worker_reasons(workers: dict[str, str] | None) -> str:
    """"name: why; ..." in name order ("" for none)."""
    return "; ".join(f"{name}: {why}" for name, why in sorted((workers or {}).items()))


def transfer_path(run_dir: Path | str, step: int) -> Path:
    return Path(run_dir) / "transfer" / f"step={step}.parquet"


def write_transfer_metrics(run_dir: Path | str, step: int, summary: dict[str, Any],
                           tensor_rows: list[dict[str, Any]], overwrite: bool = False) -> Path | None:
    """Write the step's file (temp + rename); None if it exists and not `overwrite` (a version
    published again, e.g. when a run resumes, keeps the record of its first publish)."""
    path = transfer_path(run_dir, step)
    if path.exists() and not overwrite:
        return None
    step_cols = {"step": step, "version": summary["version"], "kind": summary["kind"],
                 "base_version": summary.get("base_version"), "reason": summary.get("reason", ""),
                 "pushed_bytes": summary["encoded_bytes"], "push_s": summary["push_s"],
                 "publish_s": summary["publish_s"], "pull_s_max": summary.get("pull_s", 0.0),
                 "apply_s_max": summary.get("apply_s", 0.0),
                 "load_s_max": summary.get("load_s", 0.0),
                 "pulled_bytes_max": summary.get("pulled_bytes", 0),
                 "workers_synced": summary.get("workers_synced", 0),
                 "full_fallbacks": summary.get("full_fallbacks", 0),
                 "workers_left_out": worker_reasons(summary.get("left_out")),
                 "workers_skipped": worker_reasons(summary.get("skipped")),
                 "link_gbps": summary.get("link_gbps"),
                 "cpu_speed": None if summary.get("cpu_speed") is None
                 else json.dumps(summary["cpu_speed"], sort_keys=True),
                 "coders": summary.get("coders", 0),
                 "rank_bytes": None if summary.get("rank_bytes") is None
                 else json.dumps(summary["rank_bytes"], sort_keys=True),
                 "worker_pulled_bytes": json.dumps({w["worker"]: int(w.get("bytes") or 0)
                                                    for w in summary.get("workers", []) if "worker" in w},
                                                   sort_keys=True)}
    rows = [{**step_cols, **{k: r[k] for k in ("name", "layer", "numel", "changed", "density",
                                                "encoding", "raw_bytes", "encoded_bytes",
                                                "encode_s")}} for r in tensor_rows]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path
