"""A small recorded data directory: two runs of three RL steps, a rollout and a serving worker,
written the way a run writes them (step-metric tables and trajectory turns)."""
from __future__ import annotations

import pytest

from storage.metrics.store import StepMetricsStore
from storage.trajectories.dataset import TrajectoryStore
from tests.test_trajectories import turn

RUNS = ("r1", "r2")
STEPS = (1, 2, 3)


def step_summary(step: int, run_index: int = 0, serving: bool = True) -> dict:
    s = {"step": step, "policy_version": step, "reward": 0.2 + 0.05 * step + 0.01 * run_index,
         "success_rate": 0.2 + 0.04 * step, "trajectories": 16, "turns": 40, "tokens": 9000,
         "output_tokens": 600, "tokens_per_s": 5000.0 + 100 * step,
         "prefix_cache_hit_rate": 0.7, "rollout_s": 4.0, "reward_s": 0.2, "train_s": 6.0,
         "publish_s": 1.5, "step_s": 11.9, "loss": 0.1, "grad_norm": 1.0,
         "publish_bytes": 2_000_000 + step, "rerouted_turns": step - 1,
         "borrowed_share": 0.3, "serving_workers": int(serving),
         "serving_requests": 100 if serving else 0, "slo_attainment": 0.97 if serving else None,
         "serving": {}, "by_kind": {}, "phase_states": {"rollout": "Completed"}}
    if serving:
        s["serving"] = {"serving-0": {
            "worker": "serving-0", "requests": 100, "failed": 0, "ttft_p99_s": 0.08 * step,
            "tpot_p99_s": 0.02, "slo_ttft_s": 0.5, "slo_tpot_s": 0.03, "slo_met": 97,
            "slo_attainment": 0.97, "rollout_admitted": 12, "rollout_aborted": step - 1}}
    return s


@pytest.fixture
def recorded(tmp_path):
    """The data directory (as ROSE_DATA_DIR) holding RUNS x STEPS."""
    metrics = StepMetricsStore(tmp_path / "metrics")
    turns = TrajectoryStore(tmp_path / "trajectories")
    for i, run in enumerate(RUNS):
        for step in STEPS:
            metrics.write_step(run, step_summary(step, i))
            turns.write_step(run, step, [
                turn(step=step, index=j, worker=w, worker_kind=w.split("-")[0], queued_s=0.01 * j)
                for j, w in enumerate(["rollout-0", "rollout-0", "serving-0"])])
    return tmp_path
