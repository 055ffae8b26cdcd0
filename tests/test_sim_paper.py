"""The simulator at the paper's scale: long-context engine terms, a dedicated GPU's KV pool with
vLLM's preemption, trajectories cut at the model's context, the paper's workload file."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.device import Device, Turn
from sim.engine_cost import REFERENCE_CONTEXT, ContextCost
from sim.events import EventLoop
from sim.fleet import context_cost, load_fleet
from sim.paper_workloads import QWEN3_8B_FROZENLAKE, prefill_share
from sim.profiles import PROFILE_DIR, load_profile
from sim.workload import WorkloadSpec


def test_context_terms_follow_the_device_and_the_model():
    spec = load_fleet("h100_qwen3_8b")
    ctx = context_cost(spec)
    # Qwen3-8B: 36 layers x 2 (K, V) x 8 heads x 128 x 2 bytes per token, read at 3.35 TB/s
    assert ctx.kv_s_per_token == pytest.approx(36 * 2 * 8 * 128 * 2 / 3.35e12)
    # decode at the profile's own context per request costs nothing extra; beyond it, linear
    assert ctx.decode_extra(16, 16 * REFERENCE_CONTEXT) == 0.0
    assert ctx.decode_extra(16, 16 * 16384) == pytest.approx(16 * (16384 - 512) * ctx.kv_s_per_token)
    # the attention rate is the profile's own: between the H100's dense bf16 peak and a tenth of it
    flops = 4 * 36 * 32 * 128 / ctx.attn_s_per_pair
    assert 1e14 < flops < 9.9e14
    assert ctx.chunk_extra(512, 0) == 0.0 and ctx.chunk_extra(512, 8192) > ctx.chunk_extra(512, 4096) > 0
    # a fleet with no bandwidth (or the CPU profiles) has no context term
    assert not ContextCost.none().active
    with pytest.raises(ValueError):
        ContextCost(-1.0)


def _device(pool: int | None, context: ContextCost | None = None):
    loop, done = EventLoop(), []
    dev = Device(loop, "r", "rollout", load_profile("h100_qwen3_8b"), lambda d, t: done.append(t),
                 lambda d, t: pytest.fail("a dedicated GPU never aborts"), context=context, kv_pool=pool)
    return loop, dev, done


def test_a_full_kv_pool_preempts_the_youngest_and_every_turn_still_finishes():
    loop, dev, done = _device(pool=30)  # 960 tokens: two 600-token turns outgrow it
    for i in range(2):
        dev.submit(Turn(f"t{i}", 100, 500), False)
    loop.run()
    assert dev.preempted >= 1
    assert sorted(t.tid for t in done) == ["t0", "t1"]
    assert sum(t.context + t.response for t in done) == 2 * 600  # recompute keeps the token count
    assert dev.kv_used == 0


def test_long_contexts_make_the_same_turns_slower():
    ctx = context_cost(load_fleet("h100_qwen3_8b"))
    times = []
    for c in (None, ctx):
        loop, dev, done = _device(pool=None, context=c)
        for i in range(8):
            dev.submit(Turn(f"t{i}", 20000, 200), False)
        loop.run()
        assert len(done) == 8
        times.append(loop.now)
    assert times[1] > 1.2 * times[0]


def test_trajectories_end_at_the_models_context():
    spec = replace(QWEN3_8B_FROZENLAKE, max_context=4096, response_median=2000.0).spec()
    rng = random.Random(3)
    cut = 0
    for _ in range(500):
        t = spec.sample(rng)
        context = t.first_prompt
        for k, r in enumerate(t.responses):
            context += r
            assert context <= 4096
            if k + 1 < t.turns:
                context += t.obs[k]
        assert len(t.obs) == t.turns - 1 == len(t.dispatch_s) and len(t.env_s) == t.turns
        cut += context >= 4000
    assert cut > 50  # the cap binds for long responses


def test_the_shipped_paper_workload_reproduces_the_published_prefill_share():
    spec = WorkloadSpec.load(PROFILE_DIR / "workload_paper_qwen3_8b_frozenlake.json")
    assert spec.max_context == 32768 and "response_scale" in spec.q
    assert {"max_context", "response", "turns", "response_scale"} <= set(spec.citations)
    assert prefill_share(spec, n=3000, seed=11) == pytest.approx(0.77, abs=0.02)  # ROSE paper §2


def test_a_two_mode_tail_puts_its_share_of_trajectories_at_the_long_level():
    two = replace(QWEN3_8B_FROZENLAKE, long_share=0.2, long_level=20.0, trajectory_sigma=0.3).spec()
    rng = random.Random(5)
    levels = [two._draw(rng, "response_scale") for _ in range(4000)]
    # the modes' medians are 1 and 20: a level above their geometric middle is a long trajectory
    assert sum(x > 20 ** 0.5 for x in levels) / len(levels) == pytest.approx(0.2, abs=0.03)
    long = sorted(x for x in levels if x > 20 ** 0.5)
    assert long[len(long) // 2] == pytest.approx(20.0, rel=0.25)
    # no second mode: the one log-normal the fitted workload ships
    assert list(replace(QWEN3_8B_FROZENLAKE, long_share=0.0).spec().q["response_scale"]) == \
        list(QWEN3_8B_FROZENLAKE.spec().q["response_scale"])
    for bad in (dict(long_share=1.0), dict(long_share=-0.1), dict(long_level=0.5)):
        with pytest.raises(ValueError, match="long_share must be in"):
            replace(QWEN3_8B_FROZENLAKE, **bad)


def test_a_workload_file_is_checked():
    q = WorkloadSpec.load(PROFILE_DIR / "workload_frozenlake.json").q
    bad = {k: list(v) for k, v in q.items()} | {"nonsense": [0.0] * 21}
    with pytest.raises(ValueError, match="unknown distributions"):
        WorkloadSpec(bad, 0.5)
    falling = {k: list(v) for k, v in q.items()} | {"response": list(range(21, 0, -1))}
    with pytest.raises(ValueError, match="non-decreasing"):
        WorkloadSpec(falling, 0.5)


def test_a_run_that_cannot_finish_its_steps_says_so(monkeypatch):
    import sim.cluster as cluster

    monkeypatch.setattr(cluster, "MAX_STEP_S", 0.05)  # no step of FrozenLake turns ends this soon
    r = ClusterSim(SimConfig(gpus=2, config="fixed", serving_ratio=0.0, steps=2, traj_per_rollout_gpu=8)).run()
    assert r["finished"] is False and r["unfinished_steps"] >= 1
    assert r["tokens_per_s"] is None  # never 0 tok/s


def test_dapo_launches_groups_until_enough_are_valid_and_drops_the_rest():
    cfg = SimConfig(gpus=4, config="fixed", serving_ratio=0.0, steps=3, traj_per_rollout_gpu=16,
                    algorithm="dapo", group_size=4, dapo_valid_rate=0.4, seed=2)
    sim = ClusterSim(cfg)
    r = sim.run()
    assert r["finished"] and r["steps"] == 3
    # 2 rollout GPUs x 16 = 32 trajectories = 8 groups wanted; at a 40% valid rate more are launched
    assert r["trajectories_started"] > 3 * 32
    assert r["trajectories_started"] == r["trajectories_finished"] + r["trajectories_dropped"]
    assert not sim.trajs and not sim.queue  # nothing of a dropped trajectory is left behind
    assert all(not d.running and not d.waiting for d in sim.devices.values())
    with pytest.raises(ValueError, match="algorithm"):
        SimConfig(algorithm="ppo")


def test_a_fixed_run_judged_at_another_slo_is_the_run_at_that_slo():
    from sim.report import judged_at

    from executors.policies.slo_admission import SLOConfig

    cfg = SimConfig(gpus=4, config="fixed", serving_ratio=1.0, steps=2, traj_per_rollout_gpu=16, serving_rate=24.0)
    sim = ClusterSim(cfg)
    at_profile = sim.run()
    slo = SLOConfig(1.5 * at_profile["ttft_p99_s"], 1.5 * at_profile["tpot_p99_s"])
    judged = judged_at(sim, at_profile, slo)
    direct = ClusterSim(replace(cfg, slo_ttft_s=slo.ttft_s, slo_tpot_s=slo.tpot_s)).run()
    assert {k: v for k, v in judged.items() if k != "wall_s"} == {k: v for k, v in direct.items() if k != "wall_s"}
    rose = ClusterSim(replace(cfg, config="rose"))
    with pytest.raises(ValueError, match="admits rollout steps"):
        judged_at(rose, rose.run(), slo)


def test_table3s_baseline_keeps_each_trajectory_on_one_dedicated_gpu():
    """The paper's pinned baseline as the figures read it: the fixed system with pinning borrows no
    serving GPU and never moves a trajectory, so every later turn finds its prefix; ROSE pinned on
    any worker borrows."""
    from sim.paper_figures import table3_modes

    cfg = dict(gpus=4, steps=1, traj_per_rollout_gpu=16, cap_per_rollout_gpu=4, serving_ratio=2.0, mode="pinned")
    dedicated = ClusterSim(SimConfig(config="fixed", **cfg)).run()
    anywhere = ClusterSim(SimConfig(config="rose", **cfg)).run()
    assert dedicated["borrowed_share"] == 0 and anywhere["borrowed_share"] > 0
    assert dedicated["affinity_hit_rate"] == 1.0  # every later turn on the worker of the one before
    modes = table3_modes(dedicated, anywhere, {}, {})
    assert list(modes) == ["pinned", "pinned_borrowing", "turnwise", "turnwise_affinity"]
    assert modes["pinned"] is dedicated  # the row every ratio of Table 3 is taken against
