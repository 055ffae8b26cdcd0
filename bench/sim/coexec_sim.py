"""Co-execution groups at cluster scale, simulated (issue 39's bench line, simulator half): RollMux's
Table 6 job mixes arriving at a cluster of 64-1,024 GPUs, placed by the product's co-execution
policy (executors/policies/coexec_group.py, driven by sim/coexec_cluster.py) against solo
disaggregation (every job its own rollout and training pools) and RollMux's heuristic baselines
Random and Greedy (Most-Idle). GPU-hours and cost ($, Table 1 prices) until the last job ends,
and each job's worst T_co / T_solo against its SLO factor. The job sizes, parked states, SLOs and
arrivals are chosen as sim/coexec_jobs.py says, each with its source in the paper.

    .venv/bin/python -m bench.sim.coexec_sim [--jobs 300] [--scales 64,128,256,512,1024] [--seed 0]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result

from sim.coexec_cluster import PLACEMENTS, simulate
from sim.coexec_jobs import MIXES, draw_jobs

# RollMux's own numbers (docs: "RollMux: ..." §7.4-7.5, the extracted text at these places)
PAPER = {
    "sim_fig15_mixed": "Mixed, SLO ~ Unif(1,2), at most 5 a group: RollMux $0.87K/h average (1.06x the offline "
                       "optimum), 100% SLO attainment, at most 504 GPUs; Random $1.62K/h (1.97x optimum), 60%; "
                       "Greedy (Most-Idle) $1.36K/h (1.66x), 62%; the baselines scale out to 1,400 GPUs",
    "sim_fig14a_by_mix": "per mix (BL, RH, TH, Mixed): RollMux 1.01-1.12x the optimum's cost, 100% attainment; "
                         "Random 1.72-2.00x, 37-58%; Greedy 1.38-1.89x, 42-61% (ranges only: the per-mix bars "
                         "are lost in the extracted text)",
    "trace_vs_solo_d": "two-week production trace (200 jobs, not the simulator): $510/h, 1.84x cheaper than "
                       "Solo-D; peak 152 vs 328 training GPUs (2.16x), 216 vs 328 rollout GPUs (1.52x)",
    "solo_d_in_simulation": "not reported: the simulation compares against the offline optimum only",
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=300, help="jobs per run (RollMux's Philly segment: 300)")
    ap.add_argument("--scales", default="64,128,256,512,1024", help="cluster GPUs, comma-separated")
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--switch-s", type=float, default=5.9, help="warm start a phase switch (RollMux: 0.8-5.9 s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "coexec_sim.json")
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    for mix in args.mixes.split(","):
        for scale in (int(s) for s in args.scales.split(",")):
            jobs = draw_jobs(mix, scale, args.jobs, seed=args.seed)
            outcomes = {p: simulate(jobs, p, switch_s=args.switch_s, seed=args.seed) for p in PLACEMENTS}
            solo = outcomes["solo"]
            for p, o in outcomes.items():
                rows.append({"mix": mix, "cluster_gpus": scale, **o.as_dict(),
                             "solo_gpu_hours_x": solo.gpu_hours / o.gpu_hours,
                             "solo_cost_x": solo.cost_usd / o.cost_usd})
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    rows = run(args)
    by = {(r["mix"], r["cluster_gpus"], r["placement"]): r for r in rows}
    cells = []
    for mix, scale in dict.fromkeys((r["mix"], r["cluster_gpus"]) for r in rows):
        rm, rnd, mi = (by[mix, scale, p] for p in ("rollmux", "random", "most_idle"))
        cells.append((mix, str(scale), f"{rm['solo_gpu_hours_x']:.2f}", f"{rm['solo_cost_x']:.2f}",
                      f"{rm['slo_attainment']:.0%}", f"{rm['worst_of_slo']:.2f}", f"{rm['mean_group_size']:.2f}",
                      f"{rnd['solo_cost_x']:.2f}", f"{rnd['slo_attainment']:.0%}",
                      f"{mi['solo_cost_x']:.2f}", f"{mi['slo_attainment']:.0%}"))
    print_table(f"Co-execution groups, {args.jobs} jobs a run: Solo-D's GPU-hours or $ / the placement's",
                ["mix", "GPUs", "RollMux GPU-h x", "$ x", "SLO met", "worst T_co/T_solo/SLO", "runs a group",
                 "Random $ x", "SLO met", "Greedy $ x", "SLO met"], cells)
    for key, text in PAPER.items():
        print(f"RollMux {key}: {text}")
    write_result(args.out, "coexec_sim", args, started, rows=rows, paper=PAPER)


if __name__ == "__main__":
    main()
