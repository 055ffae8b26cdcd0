"""The paper's baselines as configurations of the one simulator: resource-elastic GPUs that
join rollout after an allocation time, RollPacker's tail batching, the (rollout, train) split."""
from __future__ import annotations

from dataclasses import replace

import pytest

from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.fleet import sweep_settings

SMALL = SimConfig(gpus=4, steps=2, serving_ratio=1.0, traj_per_rollout_gpu=32, serving_rate=6.0)


def test_elastic_gpus_roll_out_only_after_their_allocation():
    never = ClusterSim(replace(SMALL, config="elastic", elastic_alloc_s=1e6)).run()
    fixed = ClusterSim(replace(SMALL, config="fixed")).run()
    assert never["borrowed_share"] == 0.0  # the step ended before they came
    assert never["rollout_s_mean"] == pytest.approx(fixed["rollout_s_mean"])
    sim = ClusterSim(replace(SMALL, config="elastic", elastic_alloc_s=0.0))
    at_once = sim.run()
    assert at_once["finished"] and at_once["borrowed_share"] > 0.2
    assert at_once["rollout_s_mean"] < fixed["rollout_s_mean"]
    assert not any(w.name.startswith("elastic") for w in sim.router.workers())  # released after the step
    assert ClusterSim(replace(SMALL, config="elastic", elastic_alloc_s=0.5)).run()["allocation_share"] > 0


def test_tail_batching_defers_the_long_tail_to_a_long_round():
    cfg = SimConfig(gpus=4, steps=4, config="fixed", serving_ratio=0.0, traj_per_rollout_gpu=4, tail_batching=True,
                    tail_share=0.25, workload="workload_paper_qwen3_8b_frozenlake",
                    **sweep_settings("h100_qwen3_8b", None))
    sim = ClusterSim(cfg)
    launched = []
    draw = sim._draw_batch
    sim._draw_batch = lambda n: launched.append(draw(n)) or launched[-1]
    r = sim.run()
    assert r["finished"] and r["long_rounds"] == 1
    limit = sim._threshold
    short, long_ = launched[:3], launched[3]
    assert all(sum(t.responses) <= limit for batch in short for t in batch)
    assert all(sum(t.responses) > limit for t in long_) and len(long_) == 8
    with pytest.raises(ValueError, match="GRPO"):
        replace(cfg, algorithm="dapo")


def test_the_rollout_train_split_is_configurable():
    cfg = SimConfig(gpus=48, trainers=32)
    assert (cfg.rollout_gpus, cfg.train_gpus) == (16, 32)  # the paper's 32B split
    with pytest.raises(ValueError, match="trainers"):
        SimConfig(gpus=16, trainers=16)
