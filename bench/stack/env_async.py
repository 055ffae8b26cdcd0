"""Trajectory-level vs batched environment stepping under slow environments (RollArt's claim).

Each environment step first sleeps a duration drawn per step from N(mu, sigma) (the run
config's `rollout.env_step_latency`), for sigma/mu from 0.1 to 1, on the real local stack (one
rollout worker with its vLLM engine, the product's RolloutScheduler). Two ways to step:
  trajectory  each trajectory's next turn goes out as soon as its own environment step is done
              (executors/scheduling/env_steps.py: what `rose train` does)
  batched     turn k+1 of any trajectory waits for every trajectory's turn k and its step (a
              turn-wide barrier, as batch-synchronous rollouts have: `rollout.env_stepping`)
Same episodes (same environment seeds, near-greedy sampling at --temperature so both ways play
the same turns: the tiny policy's sampled replies would end trajectories at different turns),
both from a cold prefix cache, repetitions interleaved (the machine is shared), medians shown;
the ratio is batched / trajectory rollout seconds.
RollArt reports 1.23-2.27x under N(10 s, 1-10 s) per turn; mu here is scaled to this machine's
turn time (--mean-s, default 0.2 s: a turn of the tiny policy takes ~0.1-0.5 s on 2 cores).

    ROSE_DATA_DIR=/tmp/me .venv/bin/python -m bench.stack.env_async [--reps 2] [--cvs 0.1,0.25,0.5,1]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result

MODES = ("trajectory", "batched")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mean-s", type=float, default=0.2, help="mu: mean environment step (s)")
    ap.add_argument("--cvs", default="0.1,0.25,0.5,1", help="sigma/mu points, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.01, help="sampling (near-greedy: same turns)")
    ap.add_argument("--out", type=Path, default=RESULTS / "env_async.json")
    args = ap.parse_args(argv)
    try:
        args.cvs = [float(x) for x in args.cvs.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--cvs {args.cvs!r}: comma-separated numbers, e.g. 0.1,0.5,1")
    if not args.cvs or min(args.cvs) < 0 or args.mean_s <= 0 or args.reps < 1:
        ap.error("need --mean-s > 0, --reps >= 1 and sigma/mu points >= 0")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from distributed import Client

    from executors.scheduling.scheduler import RolloutScheduler
    from executors.workers.rollout_worker import RolloutWorkerPlugin, worker_state
    from core.config import RolloutConfig, RunConfig, StackConfig, StepLatencyConfig, stack_dir
    from rose.stack.local_stack import apply_env, stack_env, start_stack, stop_stack
    from bench.lib.models import ensure_models
    from tasks.rollout import make_episodes

    started = time.perf_counter()
    from rich.console import Console
    console = Console()
    ensure_models(console)

    def run_config(cv: float) -> RunConfig:
        latency = StepLatencyConfig(mean_s=args.mean_s, std_s=cv * args.mean_s)
        return RunConfig(run_id="env-async", rollout=RolloutConfig(
            groups=args.groups, group_size=args.group_size, max_turns=args.max_turns,
            temperature=args.temperature,
            max_concurrency_per_worker=args.groups * args.group_size, env_step_latency=latency))

    def reset_prefix_cache() -> bool:  # nested: pickled by value (workers cannot import bench/)
        from executors.workers.rollout_worker import _plugin
        _plugin().loop.call(lambda engine: engine.reset_prefix_cache())
        return True

    runs: dict[str, list[dict]] = {f"{cv:g} {m}": [] for cv in args.cvs for m in MODES}
    with console.status("starting the local stack (Dask + a vLLM rollout engine)"):
        handle = start_stack(StackConfig(rollout_workers=1, serving_workers=0, relay="filesystem"), stack_dir())
    apply_env(stack_env(handle))
    try:
        with Client(handle.dask_scheduler) as client:
            policy = run_config(args.cvs[0]).models.policy_path()
            client.register_plugin(RolloutWorkerPlugin(policy), name="rose-rollout")
            client.gather([client.submit(worker_state, workers=["rollout-0"], pure=False)])

            def one(cv: float, mode: str) -> dict:
                client.gather([client.submit(reset_prefix_cache, workers=["rollout-0"], pure=False)])
                cfg = run_config(cv)
                sched = RolloutScheduler(client, {"rollout-0": "rollout"}, config=cfg.rollout,
                                         env_stepping=mode, turn_timeout_s=60.0)
                report = sched.run(make_episodes(cfg, 1, 0))
                env_s = [r["env_s"] for r in report.rows]
                return {"seconds": report.seconds, "turns": len(report.rows),
                        "env_s_total": sum(env_s), "env_s_mean": statistics.fmean(env_s)}

            with console.status("warm-up"):
                one(args.cvs[0], "trajectory")
            for rep in range(args.reps):
                order = [(cv, m) for cv in args.cvs for m in (MODES if rep % 2 == 0 else MODES[::-1])]
                for cv, mode in order:
                    with console.status(f"rep {rep + 1}/{args.reps}: sigma/mu {cv:g}, {mode}"):
                        runs[f"{cv:g} {mode}"].append(one(cv, mode))
    finally:
        stop_stack(stack_dir())
    points = []
    for cv in args.cvs:
        med = {m: statistics.median(r["seconds"] for r in runs[f"{cv:g} {m}"]) for m in MODES}
        turns = {m: statistics.median(r["turns"] for r in runs[f"{cv:g} {m}"]) for m in MODES}
        points.append({"sigma_over_mu": cv, "mean_s": args.mean_s, "std_s": cv * args.mean_s,
                       "trajectory_s": med["trajectory"], "batched_s": med["batched"],
                       "turns": turns, "ratio": med["batched"] / med["trajectory"]})
    print_table(f"Environment stepping, N({args.mean_s:g} s, sigma) per step: rollout seconds "
                f"(median of {args.reps}), {args.groups * args.group_size} trajectories x <= {args.max_turns} turns",
                ("sigma/mu", "trajectory-level s", "batched s", "turns (traj / batched)", "batched / trajectory"),
                [(f"{p['sigma_over_mu']:g}", f"{p['trajectory_s']:.1f}", f"{p['batched_s']:.1f}",
                  f"{p['turns']['trajectory']:.0f} / {p['turns']['batched']:.0f}", f"{p['ratio']:.2f}x")
                 for p in points])
    print("RollArt (trajectory-level vs batched, N(10 s, 1-10 s)): 1.23-2.27x")
    write_result(args.out, "env_async", args, started, points=points, runs=runs,
                 paper={"rollart_ratio": [1.23, 2.27], "rollart_latency": "N(10 s, 1-10 s) per turn"})


if __name__ == "__main__":
    main()
