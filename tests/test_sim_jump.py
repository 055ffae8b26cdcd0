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
    chunks = SilentRun("rollout", 10.0, 0.03, kv=1e-6, over=-100, batch=16, slope=2e-4)  # a prefill run
    t = 10.0
    for j in range(1, 60):
        t += chunks.cost(j)
        assert chunks.end(j) == pytest.approx(t, rel=1e-12)
    assert chunks.cost(2) - chunks.cost(1) == pytest.approx(2e-4)  # before the KV term starts: the slope


@pytest.mark.parametrize("kv_pool", [None, 200])
def test_a_long_prompt_beside_decodes_jumps_chunk_to_chunk(kv_pool):
    """On a dedicated GPU a long prompt's prefill chunks (beside two decoding turns, with the
    context terms on) are taken as runs: the turns end when the per-iteration engine ends them."""
    from sim.device import Device, Turn
    from sim.events import EventLoop
    from sim.fleet import context_cost, load_fleet
    from sim.profiles import load_profile

    def run(jump: bool) -> tuple[dict, int]:
        loop, done = EventLoop(), {}
        dev = Device(loop, "rollout-0", "rollout", load_profile("h100_qwen3_8b"),
                     lambda d, t: done.setdefault(t.tid, loop.now), lambda d, t: None,
                     context=context_cost(load_fleet("h100_qwen3_8b")), kv_pool=kv_pool, jump=jump)
        dev.submit(Turn("a", context=300, response=900), prefix_hit=False)
        dev.submit(Turn("b", context=200, response=700), prefix_hit=False)
        loop.at(0.5, lambda _: dev.submit(Turn("long", context=6000, response=40), prefix_hit=False))
        loop.run()
        return done, loop.events

    (step, step_events), (jump, jump_events) = run(False), run(True)
    assert step.keys() == jump.keys() == {"a", "b", "long"}
    for tid, at in step.items():
        assert jump[tid] == pytest.approx(at, rel=1e-9), tid
    assert jump_events < step_events / 4
