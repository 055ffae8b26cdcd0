"""The simulated trainer's step model: which tokens it is charged for (SimConfig.train_tokens),
and what its (TP, PP, CP) parallelism adds per token (sim/train_parallel.py)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.fleet import fleet_settings, load_fleet, train_parallelism
from sim.paper_workloads import PAPER_TRAIN_TOKENS, qwen3_32b_setting
from sim.profiles import PROFILE_DIR
from sim.train_parallel import TrainParallelism

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


def test_the_papers_8b_rows_train_each_final_sequence_once_too():
    from sim.paper_figures import base_config, parser

    args = parser().parse_args([])
    assert base_config(args).train_tokens == PAPER_TRAIN_TOKENS
    assert base_config(args, config="rose", train_tokens="every_turn").train_tokens == "every_turn"


def test_tp_communication_grows_with_tp_and_cp_with_cp():
    base = TrainParallelism(tp=8, pp=1, cp=2, layers=64, hidden=5120, kv_width=1024, nvlink_gb_s=400.0, ib_gb_s=50.0)
    # 4 all-reduces a layer of hidden x 2 B a token, a ring moving 2 (TP - 1) / TP of it at 200 GB/s a
    # direction; a GPU's share of the tokens' TP groups is TP / GPUs: 2 (TP - 1) x 4 x 64 x 10,240 B / 200 GB/s
    assert base.tp_s_per_token() == pytest.approx(2 * 7 * 4 * 64 * 5120 * 2 / 200e9)
    by_tp = {tp: replace(base, tp=tp, cp=1).tp_s_per_token() for tp in (1, 2, 4, 8)}
    assert by_tp[1] == 0.0 and by_tp[2] < by_tp[4] < by_tp[8]
    assert by_tp[8] / by_tp[2] == pytest.approx(7.0) and by_tp[4] / by_tp[2] == pytest.approx(3.0)  # as TP - 1
    assert replace(base, nvlink_gb_s=900.0).tp_s_per_token() < base.tp_s_per_token()  # an H100 SXM's NVLink
    assert replace(base, pp=2).tp_s_per_token() == base.tp_s_per_token()  # stages share the layers
    # CP: K and V (1,024 wide / TP 8 per GPU) 3 times a layer round the ring; 16 GPUs span two nodes: InfiniBand
    assert replace(base, cp=1).cp_s_per_token() == 0.0
    assert base.cp_s_per_token() == pytest.approx(8 * 3 * 64 * 2 * 128 * 2 / 50e9)
    assert replace(base, cp=4).cp_s_per_token() == pytest.approx(3 * base.cp_s_per_token())
    # TP 4 x CP 2 fits an 8-GPU node: the ring runs over NVLink, 4x faster a direction than the NIC (a
    # GPU's K and V are twice as wide at TP 4, and its share of the tokens half as large: the same bytes)
    assert replace(base, tp=4).cp_s_per_token() == pytest.approx(base.cp_s_per_token() / 4)
    for bad in (dict(tp=0), dict(ib_gb_s=0.0), dict(pp=3)):
        with pytest.raises(ValueError):
            replace(base, **bad)


def test_the_32b_fleets_trainer_pays_its_parallelism_and_the_8b_one_none():
    measured = json.loads((PROFILE_DIR / "h100_qwen3_32b_train.json").read_text())["train_s_per_token"]
    spec = load_fleet("h100_qwen3_32b")
    par = train_parallelism(spec)
    assert (par.tp, par.pp, par.cp, par.layers, par.hidden, par.kv_width) == (8, 1, 2, 64, 5120, 1024)
    settings, how = fleet_settings(spec)
    assert settings["train_s_per_token"] == pytest.approx(measured + par.comm_s_per_token())
    assert par.tp_s_per_token() > par.cp_s_per_token() > 0 and "(8, 1, 2)" in how["train_s_per_token"]
    assert qwen3_32b_setting().train_s_per_token == pytest.approx(settings["train_s_per_token"])
    assert train_parallelism(load_fleet("h100_qwen3_8b")) is None  # data parallel, compute only
    with pytest.raises(ValueError, match="unknown keys"):
        train_parallelism(replace(spec, train_parallelism={"tp": 8, "pp": 1, "cp": 2, "dp": 2}))


def test_the_8b_table_sets_both_token_models_beside_the_papers_range():
    from sim.paper_numbers import PAPER
    from sim.paper_report import _train_tokens_table

    rows = {"final_sequence": dict(train_s=50.0, rollout_share=0.92, p75_share=0.43, rose_vs_fixed=0.98),
            "every_turn": dict(train_s=190.0, rollout_share=0.75, p75_share=0.43, rose_vs_fixed=1.03)}
    text = "\n".join(_train_tokens_table({"fig1": {"train_tokens": rows}, "paper": PAPER}, "8B"))
    assert text.startswith("| 8B trainer charged for (§6 setting) |")
    assert "| every turn's whole context | 190 | 75.0% | 43.0% | 1.03x |" in text
    assert "| paper | | > 70% | <= 30% | 1.31-1.46x over ROLL (GRPO) |" in text
