"""The paper's 32B setting in the simulator: the TP-4 engine profile derived from the measured
single-GPU one, the fleet of 4-GPU engines, and the Qwen3-32B ALFWorld workload file."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from sim.cluster import ClusterSim
from sim.fleet import context_cost, fleet_settings, load_fleet, shape_numbers
from sim.paper_workloads import QWEN3_32B_ALFWORLD, PaperWorkload, prefill_share, qwen3_32b_setting
from sim.profiles import PROFILE_DIR, load_profile, tp_sharding
from sim.serving import BLOCK
from sim.tp_profile import TPSharding
from sim.workload import WorkloadSpec

SINGLE, TP4 = "h100_qwen3_32b", "h100_qwen3_32b_tp4"
WORKLOAD = PROFILE_DIR / "workload_paper_qwen3_32b_alfworld.json"


def test_a_tp4_engine_is_faster_than_one_gpu_but_never_past_the_ideal_split():
    one, four = load_profile(SINGLE), load_profile(TP4)
    curves = {"monolithic": (one.monolithic, four.monolithic), "chunked": (one.chunked, four.chunked),
              "decode": (one.decode, four.decode)}
    for name, (a, b) in curves.items():
        for x in a.xs:
            assert a(x) / 4 < b(x) < a(x), (name, x)  # compute / 4 plus the all-reduces
    # the derived file is the derivation: its shape's 64 layers and 5,120 width, the H800's NVLink
    sh = tp_sharding(TP4)
    assert (sh.tp, sh.layers, sh.hidden, sh.nvlink_gb_s) == (4, 64, 5120, 400.0)
    assert four.decode_step(16) == pytest.approx(one.decode_step(16) / 4 + sh.comm_s(16))


def test_the_allreduce_term_grows_with_layers_width_tokens_and_a_slower_link():
    base = TPSharding(4, 64, 5120, 400.0)
    # ring all-reduce: 2 (t - 1) / t of tokens x hidden x 2 B over half the bidirectional bandwidth
    assert base.allreduce_s(512) == pytest.approx(2 * 3 / 4 * 512 * 5120 * 2 / 200e9)
    assert base.comm_s(512) == pytest.approx(2 * 64 * base.allreduce_s(512))
    assert replace(base, layers=128).comm_s(512) == pytest.approx(2 * base.comm_s(512))
    assert replace(base, hidden=10240).comm_s(512) == pytest.approx(2 * base.comm_s(512))
    assert base.comm_s(1024) > base.comm_s(512)
    assert replace(base, nvlink_gb_s=900.0).comm_s(512) < base.comm_s(512)  # an H100 SXM's NVLink
    assert replace(base, allreduce_latency_s=1e-5).comm_s(1) == pytest.approx(base.comm_s(1) + 128e-5)
    one = load_profile(SINGLE)
    same = TPSharding(1, 64, 5120, 400.0).shard(one)
    assert [same.decode(x) for x in one.decode.xs] == [one.decode(x) for x in one.decode.xs]  # TP 1: no change
    for bad in (dict(tp=0), dict(nvlink_gb_s=0.0), dict(allreduce_latency_s=-1.0)):
        with pytest.raises(ValueError):
            replace(base, **bad)


def test_the_32b_fleet_is_one_device_per_four_gpu_engine():
    spec = load_fleet("h100_qwen3_32b")
    settings, how = fleet_settings(spec)
    params, kv = shape_numbers("qwen3-32b")
    engine = 4 * 85e9 * 0.9
    assert settings["rollout_kv_blocks"] == int((engine - 2 * params) // (BLOCK * kv))
    assert settings["kv_blocks"] == int((engine - 4 * params) // (BLOCK * kv))  # rollout + serving model
    assert "h100_qwen3_32b_train.json" in how["train_s_per_token"]  # the single-GPU train profile
    # four GPUs read an engine's KV: a quarter of one H100's seconds per cached token
    assert context_cost(spec).kv_s_per_token == pytest.approx(kv / (4 * 3.35e12))


def test_the_32b_setting_is_the_papers():
    cfg = qwen3_32b_setting()
    assert (cfg.rollout_gpus, cfg.train_gpus) == (4, 32)  # 16 rollout GPUs in TP-4 engines, 32 trainers
    assert cfg.serving_gpus * 4 == 64  # ROSE's serving-GPU cap for 32B (§6)
    assert cfg.traj_per_rollout_gpu * cfg.rollout_gpus == 1024  # the 32B batch (§6)
    assert cfg.cap_per_rollout_gpu == 64  # 16 per GPU
    # a small step whose engines saturate at 4 trajectories each: the rest go to the serving engines
    r = ClusterSim(replace(cfg, steps=1, traj_per_rollout_gpu=8, cap_per_rollout_gpu=4, serving_ratio=1.0)).run()
    assert r["finished"] and r["trajectories_finished"] == 32 and r["borrowed_share"] > 0


def test_the_shipped_32b_workload_reproduces_the_published_statistics():
    spec = WorkloadSpec.load(WORKLOAD)
    assert spec.max_context == 32768  # §6: Qwen3-32B/32k
    assert {"max_context", "batch", "response", "turns", "response_scale", "first_prompt", "obs_tokens",
            "env_s"} <= set(spec.citations)
    assert "86%" in spec.citations["response"] and "960.1" in spec.citations["turns"]
    assert prefill_share(spec, n=3000, seed=5) == pytest.approx(0.86, abs=0.02)  # §2, within 2 points
    # the file's parameters rebuild its quantiles (what --fit wrote is what is read)
    w = PaperWorkload.load("qwen3_32b_alfworld")
    assert w.max_turns == 50 and w.name == QWEN3_32B_ALFWORLD.name
    assert WorkloadSpec.load(WORKLOAD).to_json() == w.spec().to_json()
    # every trajectory ends inside the context; the long tail reaches it
    rng = random.Random(7)
    ends = [t.first_prompt + sum(t.obs) + sum(t.responses) for t in (spec.sample(rng) for _ in range(1024))]
    assert max(ends) <= 32768 and sum(e > 32000 for e in ends) > 10


def test_the_32b_rows_print_beside_the_papers_numbers():
    from sim.paper_numbers import PAPER_32B
    from sim.paper_report import report_32b

    def row(tps: float, rollout: float, borrowed: float = 0.0) -> dict:
        return dict(tokens_per_s=tps, rollout_s_mean=rollout, borrowed_share=borrowed, slo_attainment=1.0,
                    trajectory_p75_share=0.5, ttft_p99_s=0.9, tpot_p99_s=0.15, slo_ttft_s=3.0, slo_tpot_s=0.3,
                    step_s_mean=rollout + 1000.0, steps=3, trajectories_started=3000)

    rows = {"fixed": row(100.0, 1500.0), "rose": row(150.0, 900.0, 0.5), "areal_style": row(120.0, 1500.0)}
    for r in rows.values():
        r["vs_fixed"] = r["tokens_per_s"] / 100.0
    d = {"paper": PAPER_32B, "setting": dict(rollout_engines=4, tp=4, serving_engines=16, train_gpus=32,
                                              trajectories_per_step=1024, steps=3, train_parallelism=[8, 1, 2],
                                              train_comm_share=0.26),
         "fig1": dict(rollout_share=0.88, p75_share=0.7, prefill_share=0.86, turn_tokens_per_sequence_token=5.0,
                      train_s=198.0, train_tokens={
                          "final_sequence": dict(train_s=198.0, rollout_share=0.88, p75_share=0.7, rose_vs_fixed=1.5),
                          "every_turn": dict(train_s=990.0, rollout_share=0.6, p75_share=0.71,
                                             rose_vs_fixed=1.2)}),
         "fig7a": rows, "dapo": dict(valid_share=0.5, fixed=rows["fixed"], rose=rows["rose"], rose_vs_fixed=1.5),
         "cap_sensitivity": [dict(per_engine=16, fixed_rollout_s=2500.0, rose_rollout_s=800.0, rose_vs_fixed=1.8,
                                  borrowed_share=0.8, slo_attainment=1.0)]}
    modes = {m: row(t, r) | dict(prefix_hit_tokens=h) for m, t, r, h in (("pinned", 100.0, 1000.0, 0.95),
                                                                       ("pinned_borrowing", 200.0, 600.0, 0.95),
                                                                       ("turnwise", 110.0, 950.0, 0.1),
                                                                       ("turnwise_affinity", 120.0, 900.0, 0.6))}
    d["table3_no_preemption"] = {"per_engine": 32, "fixed": row(90.0, 1800.0) | dict(preempted=0), "modes": modes}
    assert report_32b({}) == []  # an 8B-only result has no 32B rows
    text = "\n".join(report_32b({"qwen3_32b": d}))
    assert "16 GPUs" in text and "64 GPUs" in text and "1,024 trajectories" in text
    assert "| rose | 150 | 1.50x | 900 | 50% | 100.0% | 1.46x over ROLL (GRPO) |" in text
    assert "3.31x" in text and "2.69x" in text and "960.1" in text
    assert "| 16 | 2500 | 800 | 1.80x | 80% | 100.0% |" in text
    # Fig. 1 and ROSE / fixed with the trainer charged each way, beside the paper's
    assert "| each trajectory's final sequence once (the paper's reading) | 198 | 88.0% | 70.0% | 1.50x |" in text
    assert "| every turn's whole context | 990 | 60.0% | 71.0% | 1.20x |" in text
    assert "| paper | | > 70% | <= 30% | 1.46x over ROLL (GRPO) |" in text
    # Table 3 again at the cap where the fixed engines preempt nothing, with their count
    assert "| Table 3 routing (ROSE, 32B, 32 an engine: fixed preempted 0) |" in text
    assert "| turnwise_affinity | 120 | 1.20x | 900 | 0% | 60.0% | - |" in text  # against the dedicated baseline
    assert "| pinned, on dedicated GPUs (the paper's baseline) | 100 | 1.00x |" in text
    assert "| pinned, borrowed serving GPUs too | 200 | 2.00x |" in text
    assert "5.0x the tokens" in text and "990 s a step" in text and "(8, 1, 2)'s communication, 26%" in text


def test_the_areal_miss_is_explained_from_the_per_step_records():
    from sim.paper_report import areal_finding, from_second_step

    def run(tps: float, steps: list[tuple[float, float]]) -> dict:
        """steps: (rollout_s, end_s) of each; 100 tokens a step, 30 s training and publishing."""
        return dict(tokens_per_s=tps, per_step=[dict(tokens=100, rollout_s=r, train_s=29.0, publish_s=1.0,
                                                     step_s=r + 30.0, end_s=end) for r, end in steps])

    fixed = run(100 * 3 / 390, [(100.0, 130.0), (100.0, 260.0), (100.0, 390.0)])
    areal = run(100 * 3 / 330, [(100.0, 130.0), (100.0, 230.0), (100.0, 330.0)])  # training hidden from step 2
    rose = run(100 * 3 / 195, [(35.0, 65.0), (35.0, 130.0), (35.0, 195.0)])
    assert from_second_step(areal) == 200 / 200 and from_second_step(fixed) == 200 / 260
    assert from_second_step(run(1.0, [(1.0, 1.0)])) is None
    e = dict(fixed=fixed, areal_style=areal, rose=rose, rose_off_policy=rose)
    text = " ".join(areal_finding(e, "32B", 1.46, 2.69))
    assert text.startswith("ROSE / AReaL-style, 32B (1.69x; the paper 2.69x)")
    # steady steps of 100 s against 130 s, of which 30 s hidden; over all 3 steps 390 / 330
    assert "its steps take 100 s (its rollout, 100 s) against the fixed system's 130 s, of which 30 s" in text
    assert "1.30x; over all 3 steps" in text and "1.18x. ROSE / AReaL-style is ROSE / fixed (2.00x)" in text
    assert "1.46 / 2.69 = 0.54x ROLL's throughput" in text
    assert areal_finding({"fixed": fixed, "rose": rose}, "8B", 1.31, 1.44) == []
