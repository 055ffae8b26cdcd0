"""Per-step metric tables: written per step, rewritten not duplicated, queryable with the turns
(storage.catalog, `rose query`), documented, and mirrored as TensorBoard events."""
from __future__ import annotations

from pathlib import Path

from storage.catalog import VIEWS, query
from storage.metrics.record import record_step
from storage.metrics.kv_timeline import TIMELINE_SCHEMA
from storage.metrics.schema import SERVING_SCHEMA, STEP_SCHEMA
from storage.metrics.store import StepMetricsStore
from storage.metrics.tensorboard import scalars
from tests.dashboard_fixtures import RUNS, STEPS, T0, recorded, step_summary  # noqa: F401

DOC = Path(__file__).resolve().parents[1] / "docs" / "step_metrics_schema.md"


def test_views_hold_one_row_per_step_and_per_serving_worker(recorded):
    steps = query(recorded, "SELECT run, count(*) n, max(step) last FROM steps GROUP BY run "
                            "ORDER BY run").to_pylist()
    assert steps == [{"run": r, "n": len(STEPS), "last": max(STEPS)} for r in RUNS]
    serving = query(recorded, "SELECT step, worker, ttft_p99_s FROM serving WHERE run = ? "
                              "ORDER BY step", ["r1"]).to_pylist()
    assert [(r["step"], r["worker"]) for r in serving] == [(s, "serving-0") for s in STEPS]
    joined = query(recorded, "SELECT s.step, count(*) turns FROM steps s JOIN turns t "
                             "USING (run, step) WHERE run = 'r2' GROUP BY ALL ORDER BY 1")
    assert joined.column("turns").to_pylist() == [5] * len(STEPS)


def test_kv_timeline_view_holds_samples_and_events_per_worker_step(recorded):
    rows = query(recorded, "SELECT event, count(*) n, max(serving_blocks) peak, sum(denied) denied"
                           " FROM kv_timeline WHERE run = 'r1' AND step = 2 GROUP BY event"
                           " ORDER BY event NULLS FIRST").to_pylist()
    assert rows == [{"event": None, "n": 4, "peak": 55, "denied": 8},
                    {"event": "burst", "n": 1, "peak": 55, "denied": None},
                    {"event": "cut", "n": 1, "peak": 55, "denied": None},
                    {"event": "freeze", "n": 1, "peak": 55, "denied": None}]
    first = query(recorded, "SELECT epoch(min(sampled_at)) t FROM kv_timeline WHERE run = 'r1'"
                            " AND step = 1").to_pylist()
    assert first == [{"t": T0 + 10}]


def test_transfer_view_reads_every_runs_publishes(recorded):
    rows = query(recorded, "SELECT run, count(DISTINCT step) publishes, sum(encoded_bytes) sent"
                           " FROM transfer GROUP BY run ORDER BY run").to_pylist()
    assert rows == [{"run": r, "publishes": len(STEPS), "sent": 600_000 * len(STEPS)}
                    for r in RUNS]


def test_rewriting_a_step_replaces_its_rows(recorded):
    store = StepMetricsStore(recorded / "metrics")
    store.write_step("r1", {**step_summary(2), "reward": -1.0})
    rows = query(recorded, "SELECT reward FROM steps WHERE run = 'r1' AND step = 2").to_pylist()
    assert rows == [{"reward": -1.0}]
    assert store.read("serving").num_rows == len(RUNS) * len(STEPS)


def test_a_step_without_serving_workers_has_no_serving_rows(tmp_path):
    StepMetricsStore(tmp_path / "metrics").write_step("solo", step_summary(1, serving=False))
    assert query(tmp_path, "SELECT count(*) n FROM serving").to_pylist() == [{"n": 0}]
    row = query(tmp_path, "SELECT slo_attainment, serving_requests FROM steps").to_pylist()
    assert row == [{"slo_attainment": None, "serving_requests": 0}]


def test_views_exist_before_anything_is_recorded(tmp_path):
    for view in VIEWS:
        assert query(tmp_path, f"SELECT count(*) n FROM {view}").to_pylist() == [{"n": 0}]


def test_record_step_writes_tables_and_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "runs" / "r1"
    for step in (1, 2):
        record_step(tmp_path, run_dir, "r1", step_summary(step))
    assert query(tmp_path, "SELECT count(*) n FROM steps").to_pylist() == [{"n": 2}]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "step/reward" in tags and "serving/serving-0/ttft_p99_s" in tags
    assert [e.step for e in events.Scalars("step/reward")] == [1, 2]


def test_scalars_leave_out_missing_values():
    tags = scalars(step_summary(1, serving=False))
    assert "step/slo_attainment" not in tags and not any(t.startswith("serving/") for t in tags)


def test_schema_doc_names_every_field():
    text = DOC.read_text()
    for name in STEP_SCHEMA.names + SERVING_SCHEMA.names + TIMELINE_SCHEMA.names:
        assert f"`{name}`" in text, name


def test_tensorboard_reads_steps_in_order_past_ten_writes(tmp_path):
    """TensorBoard reads a directory's event files in name order; a file per step named by its
    start second and a per-process counter put step 10 before step 2 (seen in a full run as
    [2, 1]). One file per process keeps every step in the order written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from storage.metrics.tensorboard import write_events

    for step in range(1, 13):
        write_events(tmp_path / "tb", {"step": step, "reward": step / 10})
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("step/reward")] == list(range(1, 13))
