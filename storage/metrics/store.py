"""The step-metric tables on disk, and as DuckDB views `steps`, `serving` and `kv_timeline`.

Layout: <root>/<table>/run=<run>/step-<n>.parquet, one file per (run, step) in each table,
replaced atomically: a retried or resumed step rewrites its rows, never duplicates them. `run`
and `step` are columns of every file too.
"""
from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from storage.atomic import atomic_path
from storage.metrics.kv_timeline import TIMELINE_SCHEMA, timeline_table
from storage.metrics.schema import SERVING_SCHEMA, STEP_SCHEMA, serving_table, step_table

METRICS_DIR = "metrics"  # <data>/metrics: the step-metric tables of every run
TABLES = {"steps": STEP_SCHEMA, "serving": SERVING_SCHEMA, "kv_timeline": TIMELINE_SCHEMA}
_RUN_RE = re.compile(r"^[A-Za-z0-9_.-]+$")  # a directory name and a Hive partition value


class StepMetricsStore:
    """Writes the per-step tables under `root` (<data>/metrics) and exposes them to DuckDB."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def path(self, table: str, run: str, step: int) -> Path:
        if not _RUN_RE.match(run) or run in (".", ".."):
            raise ValueError(f"run id {run!r} must match {_RUN_RE.pattern}")
        return self.root / table / f"run={run}" / f"step-{int(step)}.parquet"

    def write_step(self, run: str, summary: dict) -> list[Path]:
        """The step's row of `steps`, its serving workers' rows of `serving` and their KV
        timelines' rows of `kv_timeline`."""
        written = []
        for table, rows in (("steps", step_table(run, summary)),
                            ("serving", serving_table(run, summary)),
                            ("kv_timeline", timeline_table(run, summary))):
            path = self.path(table, run, summary["step"])
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as tmp:
                pq.write_table(rows, tmp, compression="zstd")
            written.append(path)
        return written

    def read(self, table: str) -> pa.Table:
        """A whole table (every run and step), e.g. for tests; DuckDB is the query path."""
        files = sorted((self.root / table).glob("run=*/*.parquet"))
        return pa.concat_tables([pq.read_table(f, schema=TABLES[table]) for f in files]) \
            if files else TABLES[table].empty_table()

    def add_views(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create the views `steps`, `serving` and `kv_timeline` on `con` (empty tables when
        nothing is recorded)."""
        for table, schema in TABLES.items():
            if list((self.root / table).glob("run=*/*.parquet")):
                glob = str(self.root / table / "run=*" / "*.parquet").replace("'", "''")
                con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{glob}', "
                            "hive_partitioning = true, hive_types = {'run': VARCHAR}, "
                            "union_by_name = true)")
            else:
                con.register(f"_empty_{table}", schema.empty_table())
                con.execute(f"CREATE VIEW {table} AS SELECT * FROM _empty_{table}")
