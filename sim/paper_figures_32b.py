"""The paper's Qwen3-32B / ALFWorld rows, simulated beside its numbers (run by sim/paper_figures.py;
`--only-32b` runs these alone and keeps the 8B figures of the JSON it updates).

Setting (sim/paper_workloads.py qwen3_32b_setting, paper §6): rollout TP 4, so one simulated device
per 4-GPU engine on the TP-sharded H100 profile (sim/tp_profile.py); (rollout, train) = (16, 32)
GPUs; 1,024 trajectories a step; 16 at once per GPU; borrowed serving GPUs capped at 64 (16
engines); the trainer charged for each trajectory's final sequence (PAPER_TRAIN_TOKENS), with
every turn's whole context beside it in Fig. 1's table. Workload:
sim/profiles/workload_paper_qwen3_32b_alfworld.json (every parameter cited or marked chosen);
`--fit` refits its response median to the 86% prefill share and its turn median to ROSE's
published 960.1 s rollout. The serving SLO is 2x the P99 of serving alone, as for 8B.
"""
from __future__ import annotations

from argparse import Namespace

from sim.paper_figures import job, runs, slo_of, table3_modes, train_row
from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.fleet import load_fleet, train_parallelism
from sim.paper_workloads import (PAPER_TRAIN_TOKENS, QWEN3_32B_ALFWORLD, QWEN3_32B_FLEET, fit_turns_median,
                                 prefill_share, qwen3_32b_setting, turn_tokens_per_sequence_token)
from sim.paper_numbers import PAPER_32B
from sim.profiles import PROFILE_DIR
from sim.report import speedup
from sim.workload import WorkloadSpec

from executors.policies.slo_admission import SLOConfig

DAPO_VALID = 0.5  # chosen, as the 8B rows' middle share (the paper gives none)
# Table 3 again at a cap the paper's rule allows ('cap rollout concurrency ... to avoid KVC pressure',
# §4.3): the largest of 64/48/32 an engine at which the fixed engines preempted nothing in a
# one-step probe (the run records its own count)
NO_PREEMPTION_CAP = 32


def config(args: Namespace, **kw) -> SimConfig:
    return qwen3_32b_setting(**(dict(steps=args.steps, seed=args.seed) | kw))


def rose_rollout_s(args: Namespace, spec: WorkloadSpec) -> float:
    """ROSE's mean rollout seconds on `spec` (one step), at 2x the P99 of serving alone."""
    fixed_sim = ClusterSim(config(args, config="fixed", steps=1), workload=spec)
    fixed = fixed_sim.run()
    slo = SLOConfig(2 * fixed["ttft_p99_s"], 2 * fixed["tpot_p99_s"])
    rose = ClusterSim(config(args, config="rose", steps=1, slo_ttft_s=slo.ttft_s, slo_tpot_s=slo.tpot_s),
                      workload=spec).run()
    return rose["rollout_s_mean"]


def fit(args: Namespace) -> None:
    w = fit_turns_median(QWEN3_32B_ALFWORLD, PAPER_32B["prefill_share"][0], PAPER_32B["rose_rollout_s"][0],
                         lambda spec: rose_rollout_s(args, spec), lo=2.0, hi=16.0)
    print(f"fitted 32B: turns median {w.turns_median}, response median {w.response_median} -> {w.write()}")


def figures(args: Namespace) -> dict:
    """Fig. 1's statistics and Fig. 7a-c's rows for Qwen3-32B on ALFWorld: the configurations that
    set an SLO (fixed ones, serving alone) at once, then those judged at it at once."""
    if getattr(args, "fit", False):
        fit(args)
    spec = WorkloadSpec.load(PROFILE_DIR / f"workload_paper_{QWEN3_32B_ALFWORLD.name}.json")
    dapo = dict(algorithm="dapo", dapo_valid_rate=DAPO_VALID)
    # 'the per-device rollout batch size to 16' read per engine instead of per GPU (the figures' reading)
    per_engine = dict(cap_per_rollout_gpu=16, serving_max_turns=16)
    unpressed = dict(cap_per_rollout_gpu=NO_PREEMPTION_CAP, serving_max_turns=NO_PREEMPTION_CAP)
    every_turn = dict(train_tokens="every_turn")  # the trainer charged every turn's whole context
    par = train_parallelism(load_fleet(QWEN3_32B_FLEET))  # the trainer's (8, 1, 2) (sim/train_parallel.py)
    train_s_per_token = config(args).train_s_per_token  # compute + that communication
    fixed = runs({
        "fixed": job(config(args, config="fixed"), spec, "32B resource-fixed, turn-wise routing", own_slo=True),
        "every_turn": job(config(args, config="fixed", **every_turn), spec,
                          "32B fixed, every turn trained", own_slo=True),
        "dapo": job(config(args, config="fixed", **dapo), spec, f"32B DAPO {DAPO_VALID:.0%} valid: fixed",
                    own_slo=True),
        "per_engine": job(config(args, config="fixed", **per_engine), spec, "32B fixed, 16 per engine",
                          own_slo=True),
        "unpressed": job(config(args, config="fixed", **unpressed), spec,
                         f"32B fixed, {NO_PREEMPTION_CAP} per engine", own_slo=True),
        # §2's characterization setting: 'a batch size of 256 ... on 16 H800 GPUs', split (8, 8) as
        # for 8B (chosen: the paper gives no 32B split there), so 2 TP-4 rollout engines; 8 trainers
        # hold one TP-8 replica, without (8, 1, 2)'s CP ring
        "s2": job(config(args, config="fixed", serving_ratio=0.0, gpus=2 + 8, trainers=8, traj_per_rollout_gpu=128,
                         train_s_per_token=train_s_per_token - par.cp_s_per_token()),
                  spec, "32B fixed, §2 setting (256 trajectories, 8 + 8 GPUs)")})
    slo = slo_of(fixed["fixed"])
    rose = runs({
        "rose": job(config(args, config="rose", **slo), spec, "32B ROSE (64 serving GPUs)"),
        "areal_style": job(config(args, config="fixed", off_policy=1, **slo), spec,
                           "32B AReaL-style asynchronous (staleness 1)"),
        "rose_off_policy": job(config(args, config="rose", off_policy=1, **slo), spec, "32B ROSE, one-step off-policy"),
        "every_turn": job(config(args, config="rose", **every_turn, **slo_of(fixed["every_turn"])), spec,
                          "32B ROSE, every turn trained"),
        "dapo": job(config(args, config="rose", **dapo, **slo_of(fixed["dapo"])), spec,
                    f"32B DAPO {DAPO_VALID:.0%} valid: ROSE"),
        "per_engine": job(config(args, config="rose", **per_engine, **slo_of(fixed["per_engine"])), spec,
                          "32B ROSE, 16 per engine"),
        **{f"table3_{mode}": job(config(args, config="rose", mode=mode, **slo), spec, f"32B ROSE, {mode}")
           for mode in ("pinned", "turnwise")},
        "table3_dedicated": job(config(args, config="fixed", mode="pinned", **slo), spec,
                                "32B pinned to dedicated engines"),
        "unpressed_dedicated": job(config(args, config="fixed", mode="pinned", **unpressed,
                                          **slo_of(fixed["unpressed"])),
                                   spec, f"32B pinned to dedicated engines, {NO_PREEMPTION_CAP} per engine"),
        **{f"unpressed_{mode}": job(config(args, config="rose", mode=mode, **unpressed,
                                           **slo_of(fixed["unpressed"])), spec,
                                    f"32B ROSE, {mode}, {NO_PREEMPTION_CAP} per engine")
           for mode in ("pinned", "turnwise", "turnwise_affinity")}})
    rows = {"fixed": fixed["fixed"], "rose": rose["rose"], "areal_style": rose["areal_style"],
            "rose_off_policy": rose["rose_off_policy"]}
    for r in rows.values():
        r["vs_fixed"] = speedup(r, rows["fixed"])
    d_fixed, d_rose, s2 = fixed["dapo"], rose["dapo"], fixed["s2"]
    cap = [_cap_row(64, rows["fixed"], rows["rose"]), _cap_row(16, fixed["per_engine"], rose["per_engine"])]
    c, f = rows["rose"], rows["fixed"]
    return {"paper": PAPER_32B, "setting": {"rollout_engines": c["rollout_gpus"], "tp": 4,
                                            "serving_engines": c["serving_gpus"], "train_gpus": c["train_gpus"],
                                            "trajectories_per_step": c["trajectories_per_step"],
                                            "steps": args.steps, "train_tokens": PAPER_TRAIN_TOKENS,
                                            "train_parallelism": [par.tp, par.pp, par.cp],
                                            "train_comm_share": par.comm_s_per_token() / train_s_per_token},
            "fig1": {"rollout_share": f["rollout_share"], "p75_share": f["trajectory_p75_share"],
                     "prefill_share": prefill_share(spec), "preempted": f["preempted"],
                     "s2_rollout_share": s2["rollout_share"], "s2_p75_share": s2["trajectory_p75_share"],
                     "s2_rollout_s": s2["rollout_s_mean"],
                     "turn_tokens_per_sequence_token": turn_tokens_per_sequence_token(spec),
                     "train_s": train_row(f, rows["rose"])["train_s"],
                     "train_tokens": {k: train_row(a, b) for k, a, b in (
                         (PAPER_TRAIN_TOKENS, f, rows["rose"]),
                         ("every_turn", fixed["every_turn"], rose["every_turn"]))}},
            "fig7a": rows, "cap_sensitivity": cap,
            "table3": table3_modes(rose["table3_dedicated"], rose["table3_pinned"], rose["table3_turnwise"],
                                   rows["rose"]),
            "table3_no_preemption": {"per_engine": NO_PREEMPTION_CAP, "fixed": fixed["unpressed"],
                                     "modes": table3_modes(rose["unpressed_dedicated"],
                                                           *(rose[f"unpressed_{m}"] for m in
                                                             ("pinned", "turnwise", "turnwise_affinity")))},
            "dapo": {"valid_share": DAPO_VALID, "fixed": d_fixed, "rose": d_rose,
                     "rose_vs_fixed": speedup(d_rose, d_fixed),
                     "launched_per_step": d_fixed["trajectories_started"] / max(1, d_fixed["steps"])}}


def _cap_row(per_engine: int, fixed: dict, rose: dict) -> dict:
    return {"per_engine": per_engine, "fixed_rollout_s": fixed["rollout_s_mean"],
            "rose_rollout_s": rose["rollout_s_mean"], "rose_vs_fixed": speedup(rose, fixed),
            "borrowed_share": rose["borrowed_share"], "slo_attainment": rose["slo_attainment"]}
