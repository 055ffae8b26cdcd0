"""Trajectories as an Arrow dataset: Parquet files partitioned Hive-style by run and step.

Layout: <root>/run=<run>/step=<step>/part-0.parquet, one file per (run, step). A step is written
whole, so rewriting it (a retried flow run) replaces the file atomically and never duplicates
rows. The files also carry run and step as columns, so each is self-describing.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from storage.atomic import atomic_path
from storage.trajectories.schema import TURN_SCHEMA, rows_to_table

PART = "part-0.parquet"
_RUN_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_STEP_DIR = re.compile(r"^step=(\d+)$")


class QueryError(ValueError):
    """A query over the trajectory dataset failed; the message is DuckDB's first line."""


def _check_run(run: str) -> str:
    # The run id becomes a directory name and a Hive partition value: keep it plain.
    if not isinstance(run, str) or not _RUN_RE.match(run) or run in (".", ".."):
        raise ValueError(f"run id {run!r} must match {_RUN_RE.pattern}")
    return run


def _check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    return step


class TrajectoryStore:
    """Writes and reads the per-turn trajectory dataset under `root`."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def step_dir(self, run: str, step: int) -> Path:
        return self.root / f"run={_check_run(run)}" / f"step={_check_step(step)}"

    def write_step(self, run: str, step: int, rows: list[dict[str, Any]]) -> Path:
        """Validate rows (SchemaError names the bad field) and write the step's partition.

        The file is written to a temporary name and renamed over part-0.parquet, so a reader
        sees the old partition or the new one, never a mix, and a rewrite replaces the step.
        """
        table = rows_to_table(list(rows), _check_run(run), _check_step(step))
        part_dir = self.step_dir(run, step)
        part_dir.mkdir(parents=True, exist_ok=True)
        final = part_dir / PART
        with atomic_path(final, fsync=True) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        for other in part_dir.glob("*.parquet"):  # written by something else: would duplicate
            if other.name != PART:
                other.unlink()
        return final

    def read_step(self, run: str, step: int) -> pa.Table:
        path = self.step_dir(run, step) / PART
        if not path.exists():
            raise FileNotFoundError(f"no trajectories for run {run!r} step {step} "
                                    f"under {self.root}")
        return pq.ParquetFile(path).read()

    def steps(self, run: str) -> list[int]:
        run_dir = self.root / f"run={_check_run(run)}"
        if not run_dir.is_dir():
            return []
        found = (_STEP_DIR.match(p.name) for p in run_dir.iterdir() if (p / PART).exists())
        return sorted(int(m.group(1)) for m in found if m)

    def runs(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name[4:] for p in self.root.glob("run=*") if p.is_dir())

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with a view `turns` over the whole dataset."""
        con = duckdb.connect(":memory:")
        files = list(self.root.glob(f"run=*/step=*/{PART}")) if self.root.is_dir() else []
        if files:
            glob = str(self.root / "run=*" / "step=*" / "*.parquet").replace("'", "''")
            # Explicit hive types: a run named "7" must stay a string; filters on run/step
            # prune whole files.
            con.execute(
                f"CREATE VIEW turns AS SELECT * FROM read_parquet('{glob}', "
                "hive_partitioning = true, hive_types = {'run': VARCHAR, 'step': BIGINT}, "
                "union_by_name = true)")
        else:  # read_parquet fails on an empty glob; an empty dataset is still queryable
            con.register("_empty_turns", TURN_SCHEMA.empty_table())
            con.execute("CREATE VIEW turns AS SELECT * FROM _empty_turns")
        return con

    def query(self, sql: str) -> pa.Table:
        """Run SQL over the view `turns`; a bad query raises QueryError with DuckDB's message."""
        return run_sql(self.connect(), sql)


def run_sql(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> pa.Table:
    """Run SQL (with `?` parameters) on `con`, then close it; QueryError with DuckDB's first line."""
    try:
        if not sql or not sql.strip():
            raise QueryError("query failed: empty SQL")
        result = con.sql(sql, params=params)
        return result.to_arrow_table() if result is not None else pa.table({})
    except duckdb.Error as e:
        text = str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        raise QueryError(f"query failed: {first}") from None
    finally:
        con.close()
