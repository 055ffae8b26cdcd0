"""What the pages draw, read through DuckDB (storage.catalog): the `steps` and `serving` views and
per-worker aggregates of `turns`, for the runs picked. Each frame is columns (name -> list),
nulls as NaN."""
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
}


@dataclass
class Frames:
    runs: list[str]
    steps: Columns = field(default_factory=dict)
    serving: Columns = field(default_factory=dict)
    workers: Columns = field(default_factory=dict)
    queued: Columns = field(default_factory=dict)


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
