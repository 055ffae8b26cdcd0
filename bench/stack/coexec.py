"""Two runs co-executed in one group (`rose train --group`) vs one after the other, on the local stack.

    ROSE_DATA_DIR=/tmp/coexec-data .venv/bin/python -m bench.stack.coexec [--steps 3]

One local stack (1 trainer, 1 rollout worker; started if needed in the current ROSE_DATA_DIR).
First each run trains alone, one after the other (solo: its measured phase times become its
shape's T_solo in the stack's table, what admission reads); then two fresh runs of the same
shapes train at once in one co-execution group (flows/coexec.py: strict round robin of the
rollout and train phases through Prefect global concurrency limits, so one run rolls out while
the other trains). Per way: makespan (first step's start to last step's end, and the whole
`train` calls' wall time, the trainer's start and first publish included), and per run its mean
step time (T_solo alone, T_co in the group) with T_co / T_solo against the run's SLO factor and
the policy's predicted T_co at admission; step times over steps 2 on. RollMux pairs a
rollout-heavy run with a training-heavy one: run a's environment steps take --env-latency-s
(an agent's tool or simulator: the rollout waits, the CPU is free), run b makes --train-updates
GRPO updates a step, so one's phase leaves room for the other's on this 2-core machine. A one-step run first warms
the stack up, unmeasured. Writes bench/results/coexec.json.
"""
from __future__ import annotations

import argparse
import contextvars
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result

RUNS = ("a", "b")  # a: rollout-heavy (slow environment steps), b: training-heavy (more updates a step)
SIZES = {"--steps": 3, "--groups": 4, "--group-size": 4, "--max-turns": 4}  # each run's steps and rollout


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, default in SIZES.items():
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--slo-factor", type=float, default=2.0)
    ap.add_argument("--env-latency-s", type=float, default=0.3,
                    help="run a: mean seconds an environment step takes (a tool, a simulator)")
    ap.add_argument("--train-updates", type=int, default=40, help="run b: GRPO updates a step")
    ap.add_argument("--out", type=Path, default=RESULTS / "coexec.json")
    args = ap.parse_args(argv)
    if args.steps < 2 or args.slo_factor < 1:
        ap.error("need --steps >= 2 and --slo-factor >= 1")
    return args


def config(args: argparse.Namespace, name: str, run_id: str, seed: int, group: str = ""):
    """Run a rolls out slowly (its environment steps wait, the CPU is free), run b trains long."""
    from core.config import RunConfig

    latency = {"mean_s": args.env_latency_s, "std_s": args.env_latency_s / 4} if name == "a" else None
    return RunConfig.model_validate({
        "run_id": run_id, "steps": args.steps, "seed": seed,
        "rollout": {"groups": args.groups, "group_size": args.group_size, "max_turns": args.max_turns,
                    "env_step_latency": latency},
        "train": {"updates_per_step": args.train_updates if name == "b" else 1},
        "coexec": {"group": group, "slo_factor": args.slo_factor}})


def measured(summaries: list[dict], wall_s: float) -> dict:
    """Makespan over every step; step and phase times over steps 2 on (step 1 warms the engine up
    and publishes the run's first version), as the stack's T_solo is measured."""
    spans, steady = [s["phase_spans"] for s in summaries], summaries[1:]
    return {"steps": len(summaries), "step_s": statistics.fmean(s["step_s"] for s in steady),
            "rollout_s": statistics.fmean(s["rollout_s"] + s["reward_s"] for s in steady),
            "train_s": statistics.fmean(s["train_s"] + s["publish_s"] for s in steady),
            "first_start": min(p["rollout"][0] for p in spans),
            "last_end": max(p["publish"][1] for p in spans), "wall_s": wall_s,
            "waited_s": [s.get("coexec", {}).get("waited_s", {}) for s in summaries],
            "trajectories": sum(s["trajectories"] for s in summaries)}


def _seconds(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def timed_train(cfg) -> tuple[list[dict], float]:
    from flows.train import train

    t0 = time.perf_counter()
    summaries = train(cfg)
    return summaries, time.perf_counter() - t0


def main(argv=None) -> None:
    args = parse_args(argv)
    from rich.console import Console

    from flows.coexec import active, pool_limits, run_shape
    from core.config import RunConfig, stack_dir
    from rose.launch import ensure_models, ensure_stack
    from coordination.coexec_groups import CoexecGroups

    started, console = time.perf_counter(), Console()
    base = RunConfig()
    ensure_models(base, console)
    ensure_stack(base, console)
    tag = time.strftime("%H%M%S")
    timed_train(config(args, "a", f"coexec-warm-{tag}", seed=9).model_copy(update={"steps": 1}))  # not measured

    solo: dict[str, dict] = {}
    for i, name in enumerate(RUNS):  # one after the other: each alone on the stack
        summaries, wall = timed_train(config(args, name, f"coexec-solo-{name}-{tag}", seed=i))
        solo[name] = measured(summaries, wall)
        console.print(f"solo {name}: {solo[name]['step_s']:.2f} s a step, {wall:.1f} s in all")

    group = f"bench-{tag}"
    cfgs = [config(args, name, f"coexec-co-{name}-{tag}", seed=i, group=group) for i, name in enumerate(RUNS)]
    placements: dict[str, dict] = {}

    def watch_placement(cfg) -> None:  # what admission said, read while the run is a member
        while cfg.run_id not in placements:
            member = active(cfg.run_id)
            if member is not None:
                placements[cfg.run_id] = {"group": member.group, "reason": member.placement.reason,
                                          "predicted_step_s": member.placement.step_times,
                                          "measured_solo": member.measured}
            time.sleep(0.05)

    with ThreadPoolExecutor(4) as pool:
        watchers = [pool.submit(watch_placement, cfg) for cfg in cfgs]
        co_t0 = time.perf_counter()
        futures = [pool.submit(contextvars.copy_context().run, timed_train, cfg) for cfg in cfgs]
        results = [f.result() for f in futures]
        co_wall = time.perf_counter() - co_t0
        for w in watchers:
            w.result(timeout=5)
    co = {name: measured(summaries, wall) for name, (summaries, wall) in zip(RUNS, results)}

    seq_steps_s = sum(solo[n]["last_end"] - solo[n]["first_start"] for n in RUNS)
    co_steps_s = max(co[n]["last_end"] for n in RUNS) - min(co[n]["first_start"] for n in RUNS)
    seq_wall = sum(solo[n]["wall_s"] for n in RUNS)
    # the policy's T_co for the pair: the placement of the run admitted second (it saw both)
    pair = max((p["predicted_step_s"] for p in placements.values()), key=len, default={})
    rows = []
    for name, cfg in zip(RUNS, cfgs):
        predicted = pair.get(cfg.run_id)
        ratio = co[name]["step_s"] / solo[name]["step_s"]
        rows.append({"run": name, "solo_step_s": solo[name]["step_s"], "co_step_s": co[name]["step_s"],
                     "co_over_solo": ratio, "slo_factor": args.slo_factor, "within_slo": ratio <= args.slo_factor,
                     "predicted_co_step_s": predicted, "solo_rollout_s": solo[name]["rollout_s"],
                     "solo_train_s": solo[name]["train_s"]})
    limits = pool_limits(cfgs[0])
    result = {
        "makespan": {"sequential_steps_s": seq_steps_s, "coexec_steps_s": co_steps_s,
                     "steps_speedup": seq_steps_s / co_steps_s,
                     "sequential_wall_s": seq_wall, "coexec_wall_s": co_wall, "wall_speedup": seq_wall / co_wall},
        "rows": rows, "solo": solo, "coexec": co, "placements": placements, "group": group,
        "shapes": {name: run_shape(cfg) for name, cfg in zip(RUNS, cfgs)},
        "host_bytes_per_pool": limits.rollout_host_bytes,
        "table_after": CoexecGroups(stack_dir()).groups()}
    print_table(f"Two runs, {args.steps} steps each: one after the other vs co-executed (group {group})",
                ["way", "makespan, steps (s)", "makespan, wall (s)"],
                [("one after the other", f"{seq_steps_s:.1f}", f"{seq_wall:.1f}"),
                 ("co-executed", f"{co_steps_s:.1f}", f"{co_wall:.1f}"),
                 ("speed-up", f"{seq_steps_s / co_steps_s:.2f}x", f"{seq_wall / co_wall:.2f}x")])
    print_table("Each run's step time: co-executed (T_co) against alone (T_solo)",
                ["run", "T_solo (s)", "rollout / train alone (s)", "T_co (s)", "predicted T_co (s)",
                 "T_co / T_solo", "SLO factor"],
                [(r["run"], f"{r['solo_step_s']:.2f}", f"{r['solo_rollout_s']:.2f} / {r['solo_train_s']:.2f}",
                  f"{r['co_step_s']:.2f}", _seconds(r["predicted_co_step_s"]),
                  f"{r['co_over_solo']:.2f}x", f"{r['slo_factor']:g}x") for r in rows])
    write_result(args.out, "coexec", args, started, **result)


if __name__ == "__main__":
    main()
