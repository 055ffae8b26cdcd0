"""Elastic per-trajectory reward vs the batch reward after the rollout (RollArt's claim).

One local stack with an elastic reward pool (`rose up --reward-workers 2`: none while idle, up to
2 reward workers of --threads each), one RL step per run through the product's `train` flow,
a reward model's cost drawn per trajectory from N(--cost-s, --cost-s / 3) (the environments'
own verifiers take microseconds; RollArt's reward is a model on GPUs), environment steps slowed
to N(--env-s, --env-s / 2) so trajectories end at different times, as long-horizon agents do:
  elastic  each trajectory is scored on the pool as soon as it ends, while the rollout goes on
           (reward.service elastic)
  batch    every trajectory is scored on the pool after the rollout (reward.service batch)
Runs interleaved (elastic, batch, batch, elastic, ...), medians shown. Reward worker utilization
is busy / (workers up x threads) over the step, for the pool as it scaled, and, for the batch
baseline, as dedicated reward workers up the whole step would have it (RollArt's 6%: reward
GPUs held for the step and used only after the rollout). RollArt: rollout + reward 158 s ->
77 s, reward GPU utilization 6% -> 88%.

    ROSE_DATA_DIR=/tmp/rs .venv/bin/python -m bench.stack.reward_service [--reps 2]
"""
from __future__ import annotations

import argparse
import statistics
import time
import uuid
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result

MODES = ("elastic", "batch")


# flag, type, default, help
OPTIONS = (("--cost-s", float, 1.5, "mean reward model seconds per trajectory"),
           ("--env-s", float, 0.3, "mean environment step seconds"),
           ("--workers", int, 2, "the reward pool's cap"),
           ("--threads", int, 4, "trajectories a reward worker scores at once"),
           ("--reps", int, 2, "interleaved repetitions of each way"),
           ("--groups", int, 4, "GRPO groups a step"), ("--group-size", int, 4, "trajectories a group"),
           ("--max-turns", int, 6, "turns a trajectory at most"))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, kind, default, text in OPTIONS:
        ap.add_argument(flag, type=kind, default=default, help=text)
    ap.add_argument("--out", type=Path, default=RESULTS / "reward_service.json")
    args = ap.parse_args(argv)
    if min(args.cost_s, args.reps, args.workers, args.threads) <= 0 or args.env_s < 0:
        ap.error("need --cost-s, --reps, --workers, --threads > 0 and --env-s >= 0")
    return args


def one_step(mode: str, args) -> dict:
    from flows.train import train
    from core.config import RewardConfig, RolloutConfig, RunConfig, StepLatencyConfig

    cfg = RunConfig(run_id=f"reward-{mode}-{uuid.uuid4().hex[:6]}", steps=1, rollout=RolloutConfig(
        groups=args.groups, group_size=args.group_size, max_turns=args.max_turns,
        max_concurrency_per_worker=args.groups * args.group_size,
        env_step_latency=StepLatencyConfig(mean_s=args.env_s, std_s=args.env_s / 2)),
        reward=RewardConfig(service=mode, cost=StepLatencyConfig(mean_s=args.cost_s, std_s=args.cost_s / 3)))
    [s] = train(cfg)
    pool = s["reward_service"]
    both = s["rollout_s"] + s["reward_s"]
    slots = args.workers * args.threads
    return {"rollout_s": s["rollout_s"], "reward_s": s["reward_s"], "rollout_plus_reward_s": both,
            "utilization": pool["utilization"], "busy_s": pool["busy_seconds"],
            # the same work on `workers` reward workers held for the whole rollout + reward
            "dedicated_utilization": pool["busy_seconds"] / (slots * both),
            "queue_s_mean": pool["queue_s_mean"], "scale_up_s_max": pool["scale_up_s_max"],
            "peak_workers": pool["peak_workers"], "trajectories": pool["trajectories"],
            "mismatches": pool["mismatches"]}


def main(argv=None) -> None:
    args = parse_args(argv)
    from rich.console import Console

    from core.config import StackConfig, stack_dir
    from rose.stack.local_stack import apply_env, stack_env, start_stack, stop_stack
    from bench.lib.models import ensure_models

    started, console = time.perf_counter(), Console()
    ensure_models(console)
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    with console.status("starting the local stack (Dask, a vLLM rollout engine, the reward pool)"):
        handle = start_stack(StackConfig(rollout_workers=1, serving_workers=0, relay="filesystem",
                                         reward_workers=args.workers, reward_threads=args.threads), stack_dir())
    apply_env(stack_env(handle))
    try:
        with console.status("warm-up step"):
            one_step("elastic", args)
        for rep in range(args.reps):
            for mode in (MODES if rep % 2 == 0 else MODES[::-1]):
                with console.status(f"rep {rep + 1}/{args.reps}: {mode}"):
                    runs[mode].append(one_step(mode, args))
    finally:
        stop_stack(stack_dir())
    med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in runs[m][0]
               if all(r[k] is not None for r in runs[m])} for m in MODES}
    ratio = med["batch"]["rollout_plus_reward_s"] / med["elastic"]["rollout_plus_reward_s"]
    n = args.groups * args.group_size
    print_table(f"Reward: {n} trajectories a step, reward N({args.cost_s:g} s, {args.cost_s / 3:.2g} s) each, "
                f"environment steps N({args.env_s:g} s, {args.env_s / 2:.2g} s), pool <= {args.workers} x "
                f"{args.threads} (median of {args.reps})",
                ("reward", "rollout s", "reward s", "rollout + reward s", "utilization (pool)",
                 "utilization (dedicated)", "queue s", "scale-up s", "peak workers"),
                [(m, f"{med[m]['rollout_s']:.1f}", f"{med[m]['reward_s']:.1f}",
                  f"{med[m]['rollout_plus_reward_s']:.1f}", f"{med[m]['utilization']:.0%}",
                  f"{med[m]['dedicated_utilization']:.0%}", f"{med[m].get('queue_s_mean', 0):.2f}",
                  f"{med[m].get('scale_up_s_max', 0):.1f}", f"{med[m]['peak_workers']:.0f}") for m in MODES])
    print(f"batch / elastic rollout + reward: {ratio:.2f}x (RollArt: 158 s -> 77 s, 2.05x; "
          "reward GPU utilization 6% -> 88%)")
    write_result(args.out, "reward_service", args, started, medians=med, runs=runs, ratio=ratio,
                 paper={"rollart_rollout_plus_reward_s": [158, 77], "rollart_utilization": [0.06, 0.88]})


if __name__ == "__main__":
    main()
