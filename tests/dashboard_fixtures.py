"""A small recorded data directory: two runs of three RL steps, a rollout and a serving worker,
written the way a run writes them (step-metric tables with the serving worker's KV timeline,
trajectory turns, and each publish's transfer records)."""
from __future__ import annotations

import pytest

from storage.metrics.store import StepMetricsStore
from storage.trajectories.dataset import TrajectoryStore
from storage.weights.transfer_metrics import write_transfer_metrics
from tests.test_trajectories import turn

RUNS = ("r1", "r2")
STEPS = (1, 2, 3)
T0 = 1_767_225_600.0  # the serving worker's first step window opens here (UTC seconds)


def kv_timeline(step: int) -> dict:
    """Four samples 0.5 s apart and a burst, its cut and the freeze after it."""
    return {"started_at": T0 + 10 * step, "every_s": 0.5, "total_blocks": 100,
            "reserve_blocks": 20, "dropped_events": 0,
            "samples": [[0.0, 10, 0, 70, 0, 0], [0.5, 20, 30, 70, 4, 2], [1.0, 55, 15, 35, 1, 6],
                        [1.5, 30, 20, 35, 3, 0]],
            "events": [[0.9, "burst", 55, 40, 70, None], [0.9, "cut", 55, 40, 35, 2],
                       [1.1, "freeze", 55, 15, 35, None]]}


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
            "slo_attainment": 0.97, "rollout_admitted": 12, "rollout_aborted": step - 1,
            "rollout_denied_tpot": 5 * step, "rollout_denied_ttft": 3, "rollout_denied_kv": 0,
            "rollout_denied_yielded": step - 1, "rollout_yielded_to_users": step - 1,
            "rollout_returned_unstarted": 2, "kv_timeline": kv_timeline(step),
            # parked in step 2, woken for step 3
            "parked": step == 2, "wake_s": 1.5 if step == 3 else None,
            "pages_given_back": 0 if step == 1 else 64, "bytes_given_back": 0 if step == 1 else 3 << 20}}
    return s


def step_turns(step: int) -> list[dict]:
    """Three trajectories: t0 stays on rollout-0 (an affinity hit), t2 moves from serving-0 to
    rollout-0 (a miss); serving-0's turn used a version one older than rollout-0's."""
    rows = [turn(step=step, index=j, worker=w, worker_kind=w.split("-")[0], queued_s=0.01 * j,
                 policy_version=step - 1 - (w == "serving-0"))
            for j, w in enumerate(["rollout-0", "rollout-0", "serving-0"])]
    return rows + [turn(step=step, index=j, turn=1, policy_version=step - 1) for j in (0, 2)]


def publish(run_dir, step: int, coders: int | None = None) -> None:
    """A delta publish of two tensors: one xor_zstd, one dense; coded in `coders` processes
    (None: 2, then the threads at step 3, as after a fallback)."""
    summary = {"version": step, "kind": "delta", "base_version": step - 1, "encoded_bytes": 600_000,
               "push_s": 0.2, "publish_s": 0.9, "pull_s": 0.3, "apply_s": 0.1, "load_s": 0.05,
               "link_gbps": 10.0 / step,  # as if measured, a little slower each step
               # the host's speed, from the second publish on (the first: fitted costs)
               "cpu_speed": {"ef": [2.0, 3.0], "ternary": [1.0 + step, 2.5], "raw": [4.0, 4.0]}
               if step > 1 else None,
               "coders": (2 if step < 3 else 0) if coders is None else coders,
               # pushed by a trainer group of two ranks; one engine pulled it
               "rank_bytes": {"r0.0.0": 400_000, "r1.0.0": 200_000},
               "workers": [{"worker": "rollout-0", "bytes": 600_000 * step}]}
    tensor = {"layer": 0, "numel": 500_000, "changed": 1000, "density": 0.002}
    write_transfer_metrics(run_dir, step, summary, [
        {**tensor, "name": "a", "encoding": "xor_zstd", "raw_bytes": 1_000_000,
         "encoded_bytes": 100_000, "encode_s": 0.25},
        {**tensor, "name": "b", "encoding": "dense", "raw_bytes": 500_000,
         "encoded_bytes": 500_000, "encode_s": 0.05}])


@pytest.fixture
def recorded(tmp_path):
    """The data directory (as ROSE_DATA_DIR) holding RUNS x STEPS."""
    metrics = StepMetricsStore(tmp_path / "metrics")
    turns = TrajectoryStore(tmp_path / "trajectories")
    for i, run in enumerate(RUNS):
        for step in STEPS:
            metrics.write_step(run, step_summary(step, i))
            turns.write_step(run, step, step_turns(step))
            publish(tmp_path / "runs" / run, step)
    return tmp_path
