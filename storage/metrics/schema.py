"""The two step-metric tables (docs/step_metrics_schema.md): one row per RL step (`steps`) and
one row per serving worker per step (`serving`), built from a step summary (flows/rl_step.py)."""
from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

SCHEMA_VERSION = 1
META = {b"rose.schema_version": str(SCHEMA_VERSION).encode()}

STEP_SCHEMA = pa.schema([
    ("run", pa.string()), ("step", pa.int64()), ("policy_version", pa.int64()),
    ("recorded_at", pa.timestamp("us", tz="UTC")),
    ("reward", pa.float64()), ("success_rate", pa.float64()),
    ("trajectories", pa.int64()), ("turns", pa.int64()), ("tokens", pa.int64()),
    ("output_tokens", pa.int64()), ("tokens_per_s", pa.float64()),
    ("prefix_cache_hit_rate", pa.float64()),
    ("rollout_s", pa.float64()), ("reward_s", pa.float64()), ("train_s", pa.float64()),
    ("publish_s", pa.float64()), ("step_s", pa.float64()),
    ("loss", pa.float64()), ("grad_norm", pa.float64()),
    ("publish_bytes", pa.int64()), ("rerouted_turns", pa.int64()),
    ("borrowed_share", pa.float64()), ("serving_workers", pa.int64()),
    ("serving_requests", pa.int64()), ("slo_attainment", pa.float64()),
], metadata=META)

SERVING_SCHEMA = pa.schema([
    ("run", pa.string()), ("step", pa.int64()), ("worker", pa.string()),
    ("requests", pa.int64()), ("failed", pa.int64()),
    ("ttft_p99_s", pa.float64()), ("tpot_p99_s", pa.float64()),
    ("slo_ttft_s", pa.float64()), ("slo_tpot_s", pa.float64()), ("slo_attainment", pa.float64()),
    ("rollout_admitted", pa.int64()), ("rollout_aborted", pa.int64()),
    # rollout steps admission denied over the step, by reason; turns handed back unstarted;
    # users the rollout side yielded to (docs/step_metrics_schema.md)
    ("rollout_denied_tpot", pa.int64()), ("rollout_denied_ttft", pa.int64()),
    ("rollout_denied_kv", pa.int64()), ("rollout_denied_yielded", pa.int64()),
    ("rollout_returned_unstarted", pa.int64()), ("rollout_yielded_to_users", pa.int64()),
    # its rollout engine parked (no run held it), its last wake and what the last park gave back
    ("parked", pa.bool_()), ("wake_s", pa.float64()), ("pages_given_back", pa.int64()),
    ("bytes_given_back", pa.int64()),
], metadata=META)


def step_table(run: str, summary: dict, recorded_at: datetime | None = None) -> pa.Table:
    """The step's row; fields the summary lacks are null."""
    row = {name: summary.get(name) for name in STEP_SCHEMA.names}
    row.update(run=run, recorded_at=recorded_at or datetime.now(timezone.utc))
    return pa.Table.from_pylist([row], schema=STEP_SCHEMA)


def serving_table(run: str, summary: dict) -> pa.Table:
    """One row per serving worker that reported over the step (none without serving workers)."""
    rows = [{**{n: report.get(n) for n in SERVING_SCHEMA.names}, "run": run,
             "step": summary["step"], "worker": worker}
            for worker, report in sorted((summary.get("serving") or {}).items())]
    return pa.Table.from_pylist(rows, schema=SERVING_SCHEMA)
