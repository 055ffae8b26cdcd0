"""What the pages draw, read through DuckDB (storage.catalog): the `steps`, `serving` and
`kv_timeline` views, per-worker aggregates of `turns` and per-publish aggregates of `transfer`,
for the runs picked. Each frame is columns (name -> list), nulls as NaN."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storage.catalog import query

Columns = dict[str, list]
NAN = float("nan")  # a null number: Bokeh leaves a gap (None would draw as 0)

_SQL = {
    "steps": "SELECT * FROM steps WHERE run IN ({runs}) ORDER BY run, step",
    "serving": "SELECT * FROM serving WHERE run IN ({runs}) ORDER BY run, worker, step",
    # turns and rollout tokens per worker per step, rerouted turns among them
    "workers": "SELECT run, step, worker, any_value(worker_kind) AS worker_kind, count(*) AS turns,"
               " sum(num_prompt_tokens + len(response_ids)) AS tokens,"
               " sum(CAST(status = 'rerouted' AS INT)) AS rerouted"
               " FROM turns WHERE run IN ({runs}) GROUP BY run, step, worker"
               " ORDER BY run, step, worker",
    # time a turn waited (scheduler queue + engine queue) per worker kind
    "queued": "SELECT run, step, worker_kind, avg(queued_s) AS mean_s,"
              " quantile_cont(queued_s, 0.99) AS p99_s FROM turns WHERE run IN ({runs})"
              " GROUP BY run, step, worker_kind ORDER BY run, worker_kind, step",
    # a turn after a trajectory's first is an affinity hit when it ran where the previous did
    "affinity": "SELECT run, step, avg(CAST(worker = previous AS INT)) AS hit_rate,"
                " count(*) AS later_turns FROM (SELECT run, step, worker, lag(worker) OVER"
                " (PARTITION BY run, step, trajectory ORDER BY turn) AS previous FROM turns"
                " WHERE run IN ({runs})) WHERE previous IS NOT NULL GROUP BY run, step"
                " ORDER BY run, step",
    # versions a worker's turns lagged the trainer: step s trains version s - 1's turns
    "lag": "SELECT run, step, worker, any_value(worker_kind) AS worker_kind,"
           " avg(step - 1 - policy_version) AS mean_lag, max(step - 1 - policy_version) AS max_lag"
           " FROM turns WHERE run IN ({runs}) GROUP BY run, step, worker ORDER BY run, worker, step",
    "kv": "SELECT * FROM kv_timeline WHERE run IN ({runs}) ORDER BY run, worker, sampled_at, event NULLS FIRST",
    # per publish: dense (raw) vs encoded bytes and encode seconds per encoding chosen
    "encodings": "SELECT run, step, encoding, count(*) AS tensors, sum(raw_bytes)::DOUBLE AS raw_bytes,"
                 " sum(encoded_bytes)::DOUBLE AS encoded_bytes, sum(encode_s) AS encode_s FROM transfer"
                 " WHERE run IN ({runs}) GROUP BY run, step, encoding ORDER BY run, step, encoding",
    # per publish: what was pushed against the dense bytes, the slowest worker's pull, the
    # link rate and the host's coding speed its tensors were chosen by, and where it was coded
    "publishes": "SELECT run, step, any_value(kind) AS kind, sum(raw_bytes)::DOUBLE AS dense_bytes,"
                 " any_value(pushed_bytes) AS pushed_bytes, sum(encode_s) AS encode_s,"
                 " any_value(push_s) AS push_s, any_value(pull_s_max) AS pull_s,"
                 " any_value(apply_s_max) AS apply_s, any_value(load_s_max) AS load_s,"
                 " any_value(link_gbps) AS link_gbps, any_value(cpu_speed) AS cpu_speed,"
                 " any_value(coders) AS coders, any_value(rank_bytes) AS rank_bytes,"
                 " any_value(worker_pulled_bytes) AS worker_pulled_bytes"
                 " FROM transfer WHERE run IN ({runs}) GROUP BY run, step ORDER BY run, step",
}


@dataclass
class Frames:
    runs: list[str]
    steps: Columns = field(default_factory=dict)
    serving: Columns = field(default_factory=dict)
    workers: Columns = field(default_factory=dict)
    queued: Columns = field(default_factory=dict)
    affinity: Columns = field(default_factory=dict)
    lag: Columns = field(default_factory=dict)
    kv: Columns = field(default_factory=dict)
    encodings: Columns = field(default_factory=dict)
    publishes: Columns = field(default_factory=dict)


def list_runs(data_dir: Path) -> list[str]:
    """Runs with recorded steps, the most recently active first."""
    rows = query(data_dir, "SELECT run FROM steps GROUP BY run ORDER BY max(recorded_at) DESC")
    return rows.column("run").to_pylist()


def load(data_dir: Path, runs: list[str]) -> Frames:
    frames = Frames(runs=list(runs))
    if runs:
        marks = ", ".join("?" * len(runs))
        for name, sql in _SQL.items():
            table = query(data_dir, sql.format(runs=marks), list(runs)).to_pydict()
            setattr(frames, name, {k: [NAN if v is None else v for v in col]
                                   for k, col in table.items()})
    return frames


def groups(frame: Columns, *keys: str) -> dict[tuple, Columns]:
    """The frame's rows grouped by the values of `keys`, in order of first appearance."""
    out: dict[tuple, Columns] = {}
    names = list(frame)
    for i in range(len(frame[names[0]]) if names else 0):
        group = out.setdefault(tuple(frame[k][i] for k in keys), {n: [] for n in names})
        for n in names:
            group[n].append(frame[n][i])
    return out


def scaled(values: list, factor: float) -> list:
    return [v * factor for v in values]
