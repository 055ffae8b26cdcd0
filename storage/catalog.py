"""Every dataset ROSE records under a data directory, as one DuckDB connection: the view `turns`
(trajectories/, one row per turn), and `steps` and `serving` (metrics/, one row per RL step and
per serving worker per step). What `rose query` and the browser dashboards read."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from storage.metrics.store import METRICS_DIR, StepMetricsStore
from storage.trajectories.dataset import TrajectoryStore, run_sql

TRAJECTORIES_DIR = "trajectories"  # as rose.config.RunConfig.trajectories_dir()
VIEWS = ("turns", "steps", "serving")


def connect(data_dir: Path | str) -> duckdb.DuckDBPyConnection:
    con = TrajectoryStore(Path(data_dir) / TRAJECTORIES_DIR).connect()
    StepMetricsStore(Path(data_dir) / METRICS_DIR).add_views(con)
    return con


def query(data_dir: Path | str, sql: str, params: list | None = None) -> pa.Table:
    """SQL over the views turns, steps and serving; QueryError (storage.trajectories.dataset)
    carries DuckDB's message when it fails."""
    return run_sql(connect(data_dir), sql, params)
