"""The simulated trainer's step model: which tokens it is charged for (SimConfig.train_tokens)."""
from __future__ import annotations

import pytest

from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.paper_workloads import PAPER_TRAIN_TOKENS, qwen3_32b_setting

SMALL = dict(gpus=4, steps=1, traj_per_rollout_gpu=12, config="fixed", serving_ratio=0.0,
             train_s_per_token=1e-4, publish_s=1.0)


def _run_recording(train_tokens: str) -> tuple[dict, list]:
    """One small step, and every trajectory it sampled."""
    sim = ClusterSim(SimConfig(**SMALL, train_tokens=train_tokens))
    sampled, sample = [], sim.workload.sample
    sim.workload.sample = lambda rng: sampled.append(sample(rng)) or sampled[-1]
    return sim.run(), sampled


def test_the_trainer_is_charged_every_turn_or_each_final_sequence_once():
    every, trajs = _run_recording("every_turn")
    final, same = _run_recording("final_sequence")
    assert trajs == same and len(trajs) == 24 and every["trajectories_finished"] == 24
    [e], [f] = every["per_step"], final["per_step"]
    # every turn: each turn's whole context and response, the tokens the throughput counts
    per_turn = sum(t.first_prompt + sum(t.obs[:k]) + sum(t.responses[:k + 1])
                   for t in trajs for k in range(t.turns))
    assert e["train_tokens"] == e["tokens"] == per_turn
    # final sequence: the first prompt, every observation and every response, once per trajectory
    assert f["train_tokens"] == sum(t.first_prompt + sum(t.obs) + sum(t.responses) for t in trajs)
    assert f["tokens"] == per_turn  # the throughput still counts every turn's tokens
    assert f["train_tokens"] < e["train_tokens"]  # multi-turn trajectories re-read their context
    for step in (e, f):  # the train time follows the charged tokens (2 trainers)
        assert step["train_s"] == pytest.approx(step["train_tokens"] * 1e-4 / 2)
    with pytest.raises(ValueError, match="train_tokens"):
        SimConfig(train_tokens="per_token")


def test_the_papers_32b_setting_trains_each_final_sequence_once():
    assert PAPER_TRAIN_TOKENS == "final_sequence"
    assert qwen3_32b_setting().train_tokens == "final_sequence"
    assert qwen3_32b_setting(train_tokens="every_turn").train_tokens == "every_turn"
    assert SimConfig().train_tokens == "every_turn"  # the product's trainer: each turn a sample
