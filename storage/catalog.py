"""Every dataset ROSE records under a data directory, as one DuckDB connection: the view `turns`
(trajectories/, one row per turn), `steps`, `serving` and `kv_timeline` (metrics/, per RL step,
per serving worker per step, per KV sample or memory event), and `transfer` (each run's
runs/<run>/transfer/, one row per published tensor per publish). What `rose query` and the
browser dashboards read."""
from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from storage.metrics.store import METRICS_DIR, StepMetricsStore
from storage.trajectories.dataset import TrajectoryStore, run_sql

TRAJECTORIES_DIR = "trajectories"  # as core.config.RunConfig.trajectories_dir()
RUNS_DIR = "runs"  # as core.config.RunConfig.run_dir(): <data>/runs/<run>
VIEWS = ("turns", "steps", "serving", "kv_timeline", "transfer")
# storage/weights/transfer_metrics.SCHEMA (not imported: it pulls in torch), for the empty view
_TRANSFER_COLUMNS = (
    "step BIGINT, version BIGINT, kind VARCHAR, base_version BIGINT, reason VARCHAR, name VARCHAR, "
    "layer BIGINT, numel BIGINT, changed BIGINT, density DOUBLE, encoding VARCHAR, "
    "raw_bytes BIGINT, encoded_bytes BIGINT, encode_s DOUBLE, pushed_bytes BIGINT, push_s DOUBLE, "
    "publish_s DOUBLE, pull_s_max DOUBLE, apply_s_max DOUBLE, load_s_max DOUBLE, "
    "pulled_bytes_max BIGINT, workers_synced BIGINT, full_fallbacks BIGINT, "
    "workers_left_out VARCHAR, workers_skipped VARCHAR, link_gbps DOUBLE, cpu_speed VARCHAR, coders BIGINT, "
    "rank_bytes VARCHAR, worker_pulled_bytes VARCHAR")


def connect(data_dir: Path | str) -> duckdb.DuckDBPyConnection:
    con = TrajectoryStore(Path(data_dir) / TRAJECTORIES_DIR).connect()
    StepMetricsStore(Path(data_dir) / METRICS_DIR).add_views(con)
    add_transfer_view(con, Path(data_dir) / RUNS_DIR)
    return con


def add_transfer_view(con: duckdb.DuckDBPyConnection, runs_dir: Path) -> None:
    """`transfer`: the publish records of every run, `run` taken from the run's directory."""
    if list(runs_dir.glob("*/transfer/step=*.parquet")):
        glob = str(runs_dir / "*" / "transfer" / "step=*.parquet").replace("'", "''")
        con.execute("CREATE VIEW transfer AS SELECT regexp_extract(filename, "
                    "'/([^/]+)/transfer/[^/]+$', 1) AS run, * EXCLUDE (filename) "
                    f"FROM read_parquet('{glob}', filename = true, hive_partitioning = false, "
                    "union_by_name = true)")
    else:
        con.execute(f"CREATE TABLE _empty_transfer (run VARCHAR, {_TRANSFER_COLUMNS})")
        con.execute("CREATE VIEW transfer AS SELECT * FROM _empty_transfer")


def query(data_dir: Path | str, sql: str, params: list | None = None) -> pa.Table:
    """SQL over the views turns, steps, serving, kv_timeline and transfer; QueryError
    (storage.trajectories.dataset) carries DuckDB's message when it fails."""
    return run_sql(connect(data_dir), sql, params)
