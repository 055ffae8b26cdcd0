"""Trajectory dataset: schema validation, partition replacement, DuckDB queries."""
from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage.trajectories.queries import ANALYST_QUERIES
from storage.trajectories.dataset import QueryError, TrajectoryStore
from storage.trajectories.schema import (FIELD_NAMES, SCHEMA_VERSION, TURN_SCHEMA, SchemaError,
                                       schema_markdown, trajectory_id)

DOCS = Path(__file__).resolve().parents[1] / "docs"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def turn(step=0, group=0, index=0, turn=0, **over):
    row = dict(
        policy_version=step, group=group, trajectory=trajectory_id(step, group, index), turn=turn,
        env="frozenlake", prompt_ids=[1, 2, 3], response_ids=[7, 8], prompt_text="abc",
        response_text="xy", logprobs=[-0.5, -0.25], reward=0.0, trajectory_reward=0.0,
        advantage=None, done=False, status="ok", worker="rollout-0", worker_kind="rollout",
        queued_s=0.0, prefill_s=0.01, decode_s=0.02, env_s=0.001, num_prompt_tokens=3,
        num_cached_tokens=0, finished_at=T0)
    row.update(over)
    return row


@pytest.fixture
def store(tmp_path):
    return TrajectoryStore(tmp_path / "trajectories")


def test_trajectory_id_format():
    assert trajectory_id(3, 2, 5) == "s3-g2-t5"


def test_write_read_round_trip_fills_run_step_version(store):
    rows = [turn(step=4, turn=0), turn(step=4, turn=1, done=True, reward=1.0,
                                      logprobs=[-1.0, -2.0], finished_at=1767225600.5)]
    path = store.write_step("r1", 4, rows)
    assert path == store.root / "run=r1" / "step=4" / "part-0.parquet"
    table = store.read_step("r1", 4)
    assert table.schema.equals(TURN_SCHEMA)
    assert table.column_names == list(FIELD_NAMES)
    assert table["schema_version"].to_pylist() == [SCHEMA_VERSION] * 2
    assert table["run"].to_pylist() == ["r1", "r1"]
    assert table["step"].to_pylist() == [4, 4]
    assert table["logprobs"].to_pylist() == [[-0.5, -0.25], [-1.0, -2.0]]
    assert table["advantage"].to_pylist() == [None, None]
    # epoch seconds are accepted and land as UTC timestamps
    assert table["finished_at"][1].as_py() == datetime(2026, 1, 1, 0, 0, 0, 500000, timezone.utc)
    assert pq.ParquetFile(path).schema_arrow.metadata[b"rose.schema_version"] == b"1"


@pytest.mark.parametrize("change, field", [
    ({"status": "exploded"}, "status"),
    ({"worker_kind": "gpu"}, "worker_kind"),
    ({"reward": "high"}, "reward"),
    ({"turn": 1.5}, "turn"),             # a float would be truncated silently by Arrow
    ({"prompt_ids": [1, "a"]}, "prompt_ids"),
    ({"response_ids": [1, 2.5], "logprobs": [0.0, 0.0]}, "response_ids"),
    ({"logprobs": [-0.1]}, "logprobs"),  # one logprob for two response tokens
    ({"decode_s": -1.0}, "decode_s"),
    ({"env_s": math.nan}, "env_s"),
    ({"num_cached_tokens": 5}, "num_cached_tokens"),  # more than the 3 prompt tokens
    ({"num_prompt_tokens": 2**40}, "num_prompt_tokens"),
    ({"done": None}, "done"),
    ({"flavour": "vanilla"}, "flavour"),
    ({"step": 9}, "step"),               # row says step 9, written as step 0
    ({"schema_version": 0}, "schema_version"),
])
def test_bad_rows_name_the_field(store, change, field):
    bad = turn(index=1)
    bad.update(change)
    with pytest.raises(SchemaError, match=rf"^row 1: field '{field}'"):
        store.write_step("r1", 0, [turn(), bad])
    assert store.steps("r1") == []  # nothing written


def test_missing_field_is_named(store):
    row = turn()
    del row["worker"]
    with pytest.raises(SchemaError, match=r"^row 0: field 'worker' is missing$"):
        store.write_step("r1", 0, [row])


def test_bad_run_or_step_rejected(store):
    with pytest.raises(ValueError, match="run id"):
        store.write_step("../escape", 0, [turn()])
    with pytest.raises(ValueError, match="step"):
        store.write_step("r1", -1, [turn()])


def test_bad_rewrite_keeps_previous_partition(store):
    store.write_step("r1", 0, [turn(), turn(index=1)])
    with pytest.raises(SchemaError):
        store.write_step("r1", 0, [turn(status="nope")])
    assert store.read_step("r1", 0).num_rows == 2


def test_rewrite_replaces_partition_without_duplicates(store):
    store.write_step("r1", 0, [turn(index=i) for i in range(3)])
    store.write_step("r1", 1, [turn(step=1, index=i) for i in range(2)])
    store.write_step("r1", 0, [turn(index=i, reward=1.0) for i in range(4)])  # retried step
    assert store.steps("r1") == [0, 1]
    assert store.read_step("r1", 0).num_rows == 4
    counts = store.query("SELECT step, count(*) AS n, sum(reward) AS r FROM turns "
                         "GROUP BY step ORDER BY step").to_pylist()
    assert counts == [{"step": 0, "n": 4, "r": 4.0}, {"step": 1, "n": 2, "r": 0.0}]
    leftovers = [p.name for p in (store.root / "run=r1" / "step=0").iterdir()]
    assert leftovers == ["part-0.parquet"]


def test_query_spans_runs_and_keeps_numeric_run_names(store):
    store.write_step("7", 0, [turn()])
    store.write_step("abc", 0, [turn(), turn(index=1)])
    assert store.runs() == ["7", "abc"]
    out = store.query("SELECT run, count(*) AS n FROM turns GROUP BY run ORDER BY run")
    assert out.to_pylist() == [{"run": "7", "n": 1}, {"run": "abc", "n": 2}]
    assert out.schema.field("run").type == pa.string()


def test_empty_dataset_is_queryable(store):
    assert store.query("SELECT count(*) AS n FROM turns").to_pylist() == [{"n": 0}]
    assert store.steps("nothing") == []


def test_bad_sql_is_one_clear_error(store):
    store.write_step("r1", 0, [turn()])
    with pytest.raises(QueryError, match=r"^query failed: Parser Error"):
        store.query("SELEC * FROM turns")
    with pytest.raises(QueryError, match=r"^query failed: .*no_such_column"):
        store.query("SELECT no_such_column FROM turns")
    with pytest.raises(QueryError, match="empty SQL"):
        store.query("  ")


def _analyst_dataset(store):
    """Two steps with hand-picked rewards, timings and cache hits (expected values below)."""
    # step 0: g0 t0 succeeds in 2 turns (reward 1), g0 t1 fails in 1 turn (reward 0)
    store.write_step("run", 0, [
        turn(0, 0, 0, 0, trajectory_reward=1.0, num_prompt_tokens=10, num_cached_tokens=0,
             queued_s=0.1, prefill_s=0.2, decode_s=0.3),
        turn(0, 0, 0, 1, trajectory_reward=1.0, reward=1.0, done=True, num_prompt_tokens=20,
             num_cached_tokens=10, queued_s=0.0, prefill_s=0.1, decode_s=0.3),
        turn(0, 0, 1, 0, trajectory_reward=0.0, done=True, status="invalid_action",
             worker="serving-0", worker_kind="serving", num_prompt_tokens=10,
             num_cached_tokens=5, queued_s=0.5, prefill_s=0.5, decode_s=1.0),
    ])
    # step 1: three one-turn trajectories with rewards 1, 1, 0.5
    store.write_step("run", 1, [
        turn(1, 0, i, 0, trajectory_reward=r, done=True, num_prompt_tokens=10,
             num_cached_tokens=0, worker="serving-0", worker_kind="serving",
             queued_s=0.0, prefill_s=1.0, decode_s=1.0)
        for i, r in enumerate([1.0, 1.0, 0.5])])


def test_reward_per_step_query(store):
    _analyst_dataset(store)
    rows = store.query(ANALYST_QUERIES["reward_per_step"]).to_pylist()
    assert [(r["step"], r["trajectories"]) for r in rows] == [(0, 2), (1, 3)]
    assert rows[0]["mean_reward"] == pytest.approx(0.5)
    assert rows[1]["mean_reward"] == pytest.approx(2.5 / 3)
    assert (rows[1]["min_reward"], rows[1]["max_reward"]) == (0.5, 1.0)
    assert rows[0]["success_rate"] == pytest.approx(0.5)
    assert rows[1]["success_rate"] == pytest.approx(1.0)
    assert rows[0]["mean_turns"] == pytest.approx(1.5)


def test_turn_latency_by_worker_kind_query(store):
    _analyst_dataset(store)
    rows = {r["worker_kind"]: r for r in
            store.query(ANALYST_QUERIES["turn_latency_by_worker_kind"]).to_pylist()}
    assert rows["rollout"]["turns"] == 2 and rows["serving"]["turns"] == 4
    assert rows["rollout"]["mean_latency_s"] == pytest.approx((0.6 + 0.4) / 2)
    assert rows["serving"]["mean_latency_s"] == pytest.approx((2.0 + 3 * 2.0) / 4)
    assert rows["serving"]["mean_queued_s"] == pytest.approx(0.5 / 4)
    assert rows["rollout"]["p50_latency_s"] == pytest.approx(0.5)


def test_prefix_cache_reuse_query(store):
    _analyst_dataset(store)
    rows = {r["worker"]: r for r in store.query(ANALYST_QUERIES["prefix_cache_reuse"]).to_pylist()}
    assert rows["rollout-0"]["cache_reuse"] == pytest.approx(10 / 30)
    assert rows["serving-0"]["cache_reuse"] == pytest.approx(5 / 40)
    assert rows["serving-0"]["prompt_tokens"] == 40


def test_docs_carry_schema_and_queries():
    schema_doc = (DOCS / "trajectory_schema.md").read_text()
    assert schema_markdown() in schema_doc, "regenerate: python -m storage.trajectories.schema"
    assert f"SCHEMA_VERSION = {SCHEMA_VERSION}" in schema_doc
    queries_doc = (DOCS / "analyst_queries.md").read_text()
    for name, sql in ANALYST_QUERIES.items():
        assert sql in queries_doc, f"docs/analyst_queries.md is out of date for {name}"
