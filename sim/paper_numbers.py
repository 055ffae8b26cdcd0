"""The ROSE paper's published numbers the simulated figures are set beside (sim/paper_figures.py,
sim/paper_report.py), each with the sentence it comes from: Qwen3-8B on FrozenLake (PAPER) and
Qwen3-32B on ALFWorld (PAPER_32B)."""
from __future__ import annotations

PAPER = {  # the ROSE paper: the sentence each comes from
    "rollout_share_min": (0.70, "§2: 'The rollout stage accounts for over 70% of total time'"),
    "p75_share_max": (0.30, "§2: 'the 75th percentile (P75) is at most 30% of the end-to-end rollout time'"),
    "p75_s": ((55.0, 145.0), "§4.2: 'individual rollout stages exhibit pronounced long-tail latency, with P75 "
                             "around 55-145s and tails exceeding 400s (1(b))'"),
    "tail_s_min": (400.0, "§4.2, the same sentence"),
    "prefill_share": (0.77, "§2: 'prefill tokens account for 77% (Qwen3-8B)'"),
    "rollout_s_8": (607.0, "§2: 'the rollout time reduces from 607 s to 435 s' (Fig. 1c, 8 GPUs)"),
    "rollout_s_16": (435.0, "§2, the same sentence (16 GPUs)"),
    "grpo_vs_roll": ((1.31, 1.46), "abstract/§6.1: 1.31-1.46x over ROLL under GRPO"),
    "dapo_vs_roll": ((1.42, 3.31), "§6.1: 1.42-3.31x over ROLL under DAPO"),
    "vs_areal": ((1.44, 2.69), "abstract/§6.1: 1.44-2.69x over AReaL"),
    "table3": ((1.00, 1.11, 1.16), "§6.4 Table 3, Qwen3-8B: Baseline (pinned) 1.00, + Turn-Wise Routing 1.11, "
                                   "+ KVC Affinity 1.16"),
    "fig14": ("reductions with 16 / 8 / 4 serving GPUs lost in the text extraction", "App. E, Fig. 14"),
    "route_p99_ms": (10.0, "the issue's bound for a routing decision"),
    "allocation_share": ((0.068, 0.261), "§6 Fig. 8b: RLBoost+ and serverless RL spend 6.8-26.1% of the step "
                                        "allocating, ROSE < 0.5%"),
    "rose_allocation_max": (0.005, "§6 Fig. 8b, the same sentence"),
    "rollpacker_vs_verl": ((2.03, 2.56), "RollPacker abstract: 2.03-2.56x end-to-end over veRL (its own baseline)"),
    "scale_s": (300.0, "the issue's bound: 1,024 GPUs x 5 steps of the 8B workload in under 5 minutes"),
}
PAPER_32B = {  # the ROSE paper: the sentence each comes from
    "table3": ((1.00, 1.08, 1.48), "§6.4 Table 3, Qwen3-32B: Baseline (pinned) 1.00, + Turn-Wise Routing 1.08, "
                                   "+ KVC Affinity 1.48"),
    "prefill_share": (0.86, "§2: 'prefill tokens account for 77% (Qwen3-8B) and 86% (Qwen3-32B)' (fitted)"),
    "rollout_share_min": (0.70, "§2: 'The rollout stage accounts for over 70% of total time' (both models)"),
    "p75_share_max": (0.30, "§2, Fig. 1b: 'the 75th percentile (P75) is at most 30% of the end-to-end rollout "
                            "time' (both models)"),
    "rose_rollout_s": (960.1, "§6.2 Table 1, App. D Table 5: Qwen3-32B, ROSE, rollout 960.1 s (fitted)"),
    "grpo_vs_roll": (1.46, "§6.1: 'average throughput improvements of 1.31 and 1.46 with GRPO' (the second read "
                           "as 32B; maximum 1.76)"),
    "dapo_vs_roll": (3.31, "§6.1: DAPO 'average throughput increases by 1.42 and 3.31' (the second read as 32B; "
                           "maximum 4.39)"),
    "vs_areal": (2.69, "§6.1: 'Compared with AReaL, ROSE achieves 1.44 and 2.69' (the second read as 32B)"),
    "serving_p99_ms": ((837.5, 398.1), "§6.2 Table 1: ROSE's serving TTFT / TPOT P99 for 32B, under the "
                                       "(1000, 450) ms SLO of §6"),
}
