"""Event jumping (sim/decode_jump.py) gives the per-iteration engine's results: the paper's 8B
workload on the H100 fleet at 16 GPUs, in every configuration, and with a KV pool small enough
to preempt. Only the last bits of the clock may differ (a sum in closed form)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.decode_jump import SilentRun, last_true
from sim.fleet import sweep_settings

COUNTS = ("turns", "trajectories_finished", "serving_requests", "turns_rerouted", "turns_handed_back",
          "stall_kept", "kv_cuts", "preempted", "steps")
TIMES = ("tokens_per_s", "rollout_s_mean", "step_s_mean", "ttft_p99_s", "tpot_p99_s", "slo_attainment",
         "borrowed_share", "serving_busy_mean")


def _paper(config: str, **kw) -> SimConfig:
    base = dict(gpus=16, steps=1, config=config, workload="workload_paper_qwen3_8b_frozenlake",
                serving_ratio=2.0, traj_per_rollout_gpu=4, cap_per_rollout_gpu=16, serving_max_turns=16)
    return SimConfig(**(base | sweep_settings("h100_qwen3_8b", None) | kw))


@pytest.mark.parametrize("config,kw", [("rose", {}), ("fixed", {}), ("static", {}), ("slo_unaware", {}),
                                       ("fixed", {"rollout_kv_blocks": 900, "serving_ratio": 0.0})])
def test_jumping_between_events_changes_no_result(config, kw):
    cfg = _paper(config, **kw)
    step = ClusterSim(replace(cfg, event_jump=False)).run()
    jump = ClusterSim(cfg).run()
    assert jump["finished"] and step["finished"]
    for key in COUNTS:
        assert jump[key] == step[key], key
    for key in TIMES:
        assert jump[key] == (None if step[key] is None else pytest.approx(step[key], rel=1e-9)), key
    if "rollout_kv_blocks" in kw:
        assert step["preempted"] > 0  # the pool binds: preemption is among what jumping keeps
    assert jump["events"] < step["events"] / (2 if "rollout_kv_blocks" in kw else 4)  # what it is for


def test_a_silent_run_ends_where_its_steps_sum_to():
    run = SilentRun("rollout", 10.0, 0.02, kv=1e-6, over=-100, batch=16)
    t = 10.0
    for j in range(1, 60):
        t += run.cost(j)
        assert run.end(j) == pytest.approx(t, rel=1e-12)
    assert run.cost(1) == 0.02 and run.cost(10) > 0.02  # the context passes the reference at step 7
    assert last_true(lambda i: i <= 37, 100) == 37 and last_true(lambda i: i == 0, 5) == 0
