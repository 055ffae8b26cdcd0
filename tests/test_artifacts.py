"""Per-step Prefect artifacts: keys Prefect accepts, the numbers people look for, n/a honesty."""
from __future__ import annotations

import re

from dashboards.artifacts import artifact_key, step_markdown, step_rows

SUMMARY = {"step": 4, "reward": 0.25, "success_rate": 0.5, "tokens": 1200, "trajectories": 8,
           "turns": 20, "prefix_cache_hit_rate": 0.4, "rollout_s": 2.0, "reward_s": 0.1,
           "train_s": 0.5, "publish_s": 0.4, "step_s": 3.0, "tokens_per_s": 400.0,
           "publish_bytes": 5_000_000, "policy_version": 4, "rerouted_turns": 0,
           "arrow_path": "/d/run=r/step=4/part-0.parquet", "loss": 0.01,
           "phase_states": {"rollout": "Cached", "reward": "Cached", "train": "Completed",
                            "publish": "Completed"}}


def test_keys_are_lowercase_dashes_only_and_name_run_and_step():
    assert artifact_key("My_Run.v2", 7) == "my-run-v2-step-7"
    assert re.fullmatch(r"[a-z0-9-]+", artifact_key("A.B_C", 1))


def test_table_has_throughput_reward_phase_times_transfer_and_slo():
    rows = {r["metric"]: r["value"] for r in step_rows(SUMMARY)}
    assert rows["throughput"] == "400 tokens/s"
    assert rows["success rate"] == "50%"
    assert rows["transfer bytes (publish)"] == "5,000,000"
    assert rows["train s"] == "0.5" and rows["publish s"] == "0.4"
    assert rows["SLO attainment (serving)"] == "n/a"  # no serving workers in this step


def test_slo_attainment_shown_only_when_serving_workers_worked():
    rows = {r["metric"]: r["value"] for r in step_rows(
        {**SUMMARY, "serving_workers": 2, "slo_attainment": 0.987})}
    assert rows["SLO attainment (serving)"] == "98.7%"
    rows = {r["metric"]: r["value"] for r in step_rows({**SUMMARY, "slo_attainment": 0.9})}
    assert rows["SLO attainment (serving)"] == "n/a"


def test_markdown_says_which_phases_were_reused():
    md = step_markdown("r", SUMMARY)
    assert md.startswith("### r: step 4 -> policy v4")
    assert "reused from an earlier attempt: rollout, reward" in md
    assert "part-0.parquet" in md
    assert "http://127.0.0.1:5006/runs?runs=r" in md  # rose dashboard, this run picked
