"""Synchronous vs one-step off-policy (RunConfig.max_staleness 0 vs 1) on the local stack.

    ROSE_DATA_DIR=/tmp/rose-pipeline .venv/bin/python -m bench.learning.pipeline [--seeds 3] [--steps 10]

One local stack (1 trainer, 1 rollout worker; started if needed in the current ROSE_DATA_DIR),
the same seeds in both modes, modes alternating in order from seed to seed so drift in the
machine's load falls on both. Per run: throughput as the paper defines it, tokens / step time,
where a step's time is the interval between consecutive step ends (with the pipeline, steps
overlap, so a flow run's own duration would undercount); "steady" leaves out step 1 (engine
warm-up, and nothing to overlap with). Held-out success of each run's last checkpoint on fixed
maps (bench/learning/heldout.py, seeds 10^6..). Writes bench/results/pipeline.json.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path


from rich.console import Console
from rich.table import Table

from bench.learning.heldout import HeldOut
from bench.learning.learning_fidelity import spread, write
from core.config import RunConfig

from bench.lib.results import RESULTS
MODES = {"synchronous": 0, "one-step off-policy": 1}


def run_mode(mode: str, seed: int, steps: int, tag: str) -> dict:
    from dashboards.events import subscribe
    from flows.train import train

    cfg = RunConfig.model_validate({"run_id": f"pipeline-{tag}-k{MODES[mode]}-s{seed}",
                                    "seed": seed, "steps": steps, "max_staleness": MODES[mode]})
    ends: dict[int, float] = {}

    def on_event(event: str, data: dict) -> None:
        if event == "step_end":
            ends[data["step"]] = time.perf_counter()

    unsubscribe = subscribe(on_event)
    t0 = time.perf_counter()
    try:
        summaries = train(cfg)
    finally:
        unsubscribe()
    wall = time.perf_counter() - t0
    tokens = {s["step"]: s["tokens"] for s in summaries}
    steady_s = ends[steps] - ends[1]
    keep = ("step", "success_rate", "tokens", "rollout_s", "train_s", "publish_s", "step_s",
            "rollout_version", "stale_tokens")
    return {"run_id": cfg.run_id, "wall_s": wall, "tokens_per_s": sum(tokens.values()) / wall,
            "steady_tokens_per_s": sum(tokens[s] for s in range(2, steps + 1)) / steady_s,
            "steady_step_s": steady_s / (steps - 1), "lag": turn_lag(cfg.run_id),
            "steps": [{k: s.get(k) for k in keep} | {"end_s": ends[s["step"]] - t0}
                      for s in summaries]}


def turn_lag(run: str) -> dict[str, int]:
    """Turns per lag = (trainer's version when it trains the step = step-1) - turn's version."""
    from storage.trajectories.dataset import TrajectoryStore

    rows = TrajectoryStore(RunConfig().trajectories_dir()).query(
        f"SELECT step - 1 - policy_version AS lag, count(*) AS n FROM turns WHERE run = '{run}' "
        "GROUP BY lag ORDER BY lag").to_pylist()
    return {str(r["lag"]): r["n"] for r in rows}


def held_out(run_id: str, held: HeldOut) -> float:
    import torch

    from storage.checkpoints import load_latest_checkpoint

    ckpt = load_latest_checkpoint(RunConfig(run_id=run_id).run_dir() / "checkpoints")
    return held.success({n: t.to(torch.bfloat16) for n, t in ckpt.model_state.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--eval-maps", type=int, default=64)
    ap.add_argument("--out", type=Path, default=RESULTS / "pipeline.json")
    ap.add_argument("--note", default="", help="conditions of the run, kept in the JSON")
    args = ap.parse_args()
    console = Console(width=150)
    from rose.launch import ensure_models, ensure_stack

    base = RunConfig()
    ensure_models(base, console)
    ensure_stack(base, console)
    tag, t0 = time.strftime("%H%M%S"), time.perf_counter()
    load = {"before": os.getloadavg()}
    runs: dict[str, dict[int, dict]] = {m: {} for m in MODES}
    for seed in range(args.seeds):
        order = list(MODES) if seed % 2 == 0 else list(MODES)[::-1]
        for mode in order:
            runs[mode][seed] = run_mode(mode, seed, args.steps, tag)
            console.print(f"{mode} seed {seed}: {runs[mode][seed]['steady_tokens_per_s']:,.0f} "
                          f"tokens/s steady ({time.perf_counter() - t0:.0f} s)")
            write(args.out, {"partial": True, "tag": tag, "runs": runs})  # a crash keeps them
    load["after_runs"] = os.getloadavg()
    with HeldOut(base, args.eval_maps) as held:
        initial = held.success()
        for mode in MODES:
            for r in runs[mode].values():
                r["held_out"] = held_out(r["run_id"], held)
    report = summarize(runs, initial, args.eval_maps)
    report.update(args=vars(args) | {"out": str(args.out)}, load_average=load,
                  cores=os.cpu_count(), total_s=time.perf_counter() - t0, runs=runs)
    print_table(console, report)
    write(args.out, {"tag": tag, **report})
    console.print(f"results: {args.out}")


def summarize(runs: dict, initial: float, maps: int) -> dict:
    modes = {}
    for mode in MODES:
        rs = list(runs[mode].values())
        modes[mode] = {key: statistics.fmean(r[key] for r in rs) for key in
                       ("tokens_per_s", "steady_tokens_per_s", "steady_step_s", "held_out")}
        modes[mode]["held_out_seed_sd"] = spread([r["held_out"] for r in rs])
        modes[mode]["steady_tokens_per_s_seed_sd"] = spread([r["steady_tokens_per_s"] for r in rs])
        for phase in ("rollout_s", "train_s"):  # steady state: from step 2
            modes[mode][phase] = statistics.fmean(p[phase] for r in rs for p in r["steps"][1:])
    sync, piped = modes["synchronous"], modes["one-step off-policy"]
    gap = abs(sync["held_out"] - piped["held_out"])
    noise = max(sync["held_out_seed_sd"], piped["held_out_seed_sd"])
    # the eval's own sampling error: each mode's mean is len(runs) x `maps` Bernoulli episodes
    n = maps * len(runs["synchronous"])
    eval_se = math.sqrt(sum(m["held_out"] * (1 - m["held_out"]) / n for m in (sync, piped)))
    return {"initial_held_out": initial, "modes": modes, "held_out_gap_eval_se": eval_se,
            "speedup": piped["steady_tokens_per_s"] / sync["steady_tokens_per_s"],
            "speedup_whole_run": piped["tokens_per_s"] / sync["tokens_per_s"],
            "held_out_gap": gap, "seed_sd": noise, "within_noise": gap <= 2 * noise,
            "goal_met": piped["steady_tokens_per_s"] >= 1.3 * sync["steady_tokens_per_s"]
            and gap <= 2 * noise}


def print_table(console: Console, r: dict) -> None:
    table = Table(title=f"Pipeline: synchronous vs one-step off-policy ({r['args']['seeds']} "
                  f"seeds x {r['args']['steps']} steps, mean ± seed sd)", header_style="bold cyan")
    for col in ("mode", "tokens/s steady", "step s steady", "tokens/s whole run", "rollout s",
                "train s", "held-out success"):
        table.add_column(col, justify="right")
    for mode, m in r["modes"].items():
        table.add_row(mode, f"{m['steady_tokens_per_s']:,.0f} ± {m['steady_tokens_per_s_seed_sd']:,.0f}",
                      f"{m['steady_step_s']:.2f}", f"{m['tokens_per_s']:,.0f}",
                      f"{m['rollout_s']:.2f}", f"{m['train_s']:.2f}",
                      f"{m['held_out']:.1%} ± {m['held_out_seed_sd']:.1%}")
    console.print(table)
    console.print(f"throughput off-policy/synchronous: {r['speedup']:.2f}x steady "
                  f"({r['speedup_whole_run']:.2f}x whole run; goal 1.3x); held-out gap "
                  f"{r['held_out_gap']:.1%} vs seed sd {r['seed_sd']:.1%} "
                  f"({'within' if r['within_noise'] else 'OUTSIDE'} 2 sd; the eval's own standard "
                  f"error of the gap {r['held_out_gap_eval_se']:.1%}); initial held-out "
                  f"{r['initial_held_out']:.1%}")


if __name__ == "__main__":
    main()
