"""Per-step weight transfer metrics as a small Parquet file, one row per published tensor.

    <data>/runs/<run>/transfer/step=<n>.parquet

Each row: the tensor (name, layer, numel, changed elements, density, encoding chosen, raw and
encoded bytes, encode seconds) and, repeated, the step's publish (kind full/delta, base
version, bucket bytes pushed, push and publish seconds) and the pulls waited for (slowest pull,
apply and engine load seconds, full-snapshot fallbacks). Query with duckdb, e.g.
    SELECT step, layer, sum(changed) / sum(numel) AS density
    FROM read_parquet('<run>/transfer/*.parquet') GROUP BY ALL ORDER BY ALL
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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
])


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
                 "full_fallbacks": summary.get("full_fallbacks", 0)}
    rows = [{**step_cols, **{k: r[k] for k in ("name", "layer", "numel", "changed", "density",
                                                "encoding", "raw_bytes", "encoded_bytes",
                                                "encode_s")}} for r in tensor_rows]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
