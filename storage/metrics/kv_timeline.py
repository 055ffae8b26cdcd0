"""The `kv_timeline` table (docs/step_metrics_schema.md): each serving worker's KV blocks over an
RL step, serving vs rollout against the rollout budget, and its memory events (burst, cut,
freeze, lease reclaim), from the `kv_timeline` of the worker's step report
(executors/coserving/kv_timeline.py). One row per sample or event."""
from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from storage.metrics.schema import META

TIMELINE_SCHEMA = pa.schema([
    ("run", pa.string()), ("step", pa.int64()), ("worker", pa.string()),
    ("sampled_at", pa.timestamp("us", tz="UTC")), ("t_s", pa.float64()),
    ("event", pa.string()), ("event_count", pa.int64()),
    ("serving_blocks", pa.int64()), ("rollout_blocks", pa.int64()),
    ("budget_blocks", pa.int64()), ("total_blocks", pa.int64()), ("reserve_blocks", pa.int64()),
    ("admitted", pa.int64()), ("denied", pa.int64()),
], metadata=META)


def timeline_table(run: str, summary: dict) -> pa.Table:
    """Rows of every serving worker whose report has a timeline (none without)."""
    rows = []
    for worker, report in sorted((summary.get("serving") or {}).items()):
        tl = report.get("kv_timeline")
        if not tl:
            continue
        head = {"run": run, "step": summary["step"], "worker": worker,
                "total_blocks": tl.get("total_blocks"), "reserve_blocks": tl.get("reserve_blocks")}
        for t_s, serving, rollout, budget, admitted, denied in tl.get("samples", []):
            rows.append({**head, **_at(tl, t_s), "serving_blocks": serving,
                         "rollout_blocks": rollout, "budget_blocks": budget,
                         "admitted": admitted, "denied": denied})
        for t_s, event, serving, rollout, budget, count in tl.get("events", []):
            rows.append({**head, **_at(tl, t_s), "event": event, "event_count": count,
                         "serving_blocks": serving, "rollout_blocks": rollout,
                         "budget_blocks": budget})
    rows.sort(key=lambda r: (r["worker"], r["t_s"]))
    return pa.Table.from_pylist(rows, schema=TIMELINE_SCHEMA)


def _at(timeline: dict, t_s: float) -> dict:
    at = datetime.fromtimestamp(timeline["started_at"] + t_s, timezone.utc)
    return {"sampled_at": at, "t_s": t_s}
