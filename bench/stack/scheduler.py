"""Elastic rollout scheduler benchmarks.

Part 1, decision latency: a discrete-event rollout with N trajectories always in flight over W
workers (default 10,000 over 192 rollout + 64 serving). Each trajectory alternates a turn on a
worker with an environment step; a turn that cannot be placed waits in a FIFO queue and is retried
when a turn ends. Serving admission is random (each serving worker's decision is redrawn every
`admit_refresh` events) and declines above `serving_soft_cap` turns; as a co-serving executor
would, the simulated executors push their decision changes (`set_admitting`) unless the case says
callback only. Trajectories end after a random number of turns and are replaced, so `forget` and
fresh placements are exercised too. Every `route()` call is timed with time.perf_counter_ns; so is
the bookkeeping (turn start/end plus the admission push it triggers).

    .venv/bin/python -m bench.stack.scheduler [--decisions 200000] [--seed 0]

Part 2, ablation on the real local stack (bench/stack/scheduler_ablation.py): pinned vs turn-wise vs
turn-wise + affinity, rollout time and prefix-cache hit rate, and the same step with and without
the lent worker:

    ROSE_DATA_DIR=/tmp/me .venv/bin/python -m bench.stack.scheduler --ablation [--reps 3]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import os
import platform
import random
import time
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np
from rich.console import Console
from rich.table import Table

from executors.policies.router import TurnRouter, WorkerInfo

from bench.lib.results import RESULTS, write_json


@dataclass(frozen=True)
class LatencyCase:
    name: str
    mode: str = "turnwise_affinity"
    rollout_workers: int = 192
    serving_workers: int = 64
    trajectories: int = 10_000
    cap: int = 16
    admit_p: float = 0.5  # chance a serving worker's admission accepts at a refresh
    serving_soft_cap: int = 48  # admission declines above this many rollout turns
    admit_refresh: int = 1_000  # events between redraws of the admission decisions
    max_turns: int = 12
    push_admission: bool = True  # False: the router learns admission only through `admits`


def latency_cases() -> list[LatencyCase]:
    return [
        LatencyCase("turnwise+affinity"),
        LatencyCase("turnwise", mode="turnwise"),
        LatencyCase("pinned", mode="pinned"),
        LatencyCase("turnwise+affinity, admission callback only", push_admission=False),
        LatencyCase("turnwise+affinity, serving admits 2%", admit_p=0.02),
        LatencyCase("turnwise+affinity, 4x scale", rollout_workers=768, serving_workers=256,
                    trajectories=40_000),
    ]


class GcPauses:
    """Times the collector's pauses (gc.callbacks), to tell them apart in the latency tail."""

    def __init__(self) -> None:
        self.pauses_ns: list[int] = []
        self._t0 = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        else:
            self.pauses_ns.append(time.perf_counter_ns() - self._t0)

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def run_latency(case: LatencyCase, decisions: int, seed: int) -> dict:
    """Simulate until `decisions` route() calls were timed; return latency percentiles (us)."""
    with GcPauses() as pauses:
        result = _simulate(case, decisions, seed)
    result["gc_pause_ms"] = {"count": len(pauses.pauses_ns),
                             "max": max(pauses.pauses_ns, default=0) / 1e6}
    return result


def _simulate(case: LatencyCase, decisions: int, seed: int) -> dict:
    rng = random.Random(seed)
    router = TurnRouter(cap_per_rollout_worker=case.cap, mode=case.mode)
    serving = [f"serving-{i}" for i in range(case.serving_workers)]
    for i in range(case.rollout_workers):
        router.register_worker(WorkerInfo(f"rollout-{i}", "rollout"))
    for name in serving:
        router.register_worker(WorkerInfo(name, "serving"))
    open_gate: dict[str, bool] = {}

    def admits(name: str) -> bool:  # the co-serving executor's current decision: a flag read
        return open_gate[name] and router.load(name) < case.serving_soft_cap

    def push(name: str) -> None:  # the executor reports its decision after each change
        if case.push_admission and name in open_gate:
            router.set_admitting(name, admits(name))

    events: list[tuple[float, int, str, str]] = []  # (time, seq, what, trajectory)
    turns_left: dict[str, int] = {}
    queue: deque[str] = deque()
    route_ns = np.empty(decisions, dtype=np.int64)
    book_ns: list[int] = []
    timed = seq = born = placed = placed_serving = affine = queued = 0
    now = 0.0
    clock = time.perf_counter_ns

    def new_trajectory() -> None:
        nonlocal seq, born
        tid = f"traj-{born}"
        born += 1
        turns_left[tid] = rng.randint(1, case.max_turns)
        seq += 1
        heapq.heappush(events, (now + rng.random(), seq, "ready", tid))

    def try_place(tid: str) -> bool:
        nonlocal timed, seq, placed, placed_serving, affine
        t0 = clock()
        worker = router.route(tid, admits)
        t1 = clock()
        if timed < decisions:
            route_ns[timed] = t1 - t0
            timed += 1
        if worker is None:
            return False
        t0 = clock()
        placement = router.on_turn_start(tid, worker)
        push(worker)
        book_ns.append(clock() - t0)
        placed += 1
        placed_serving += placement.kind == "serving"
        affine += placement.affine
        seq += 1
        heapq.heappush(events, (now + rng.expovariate(1.0), seq, "turn_end", tid))
        return True

    for _ in range(case.trajectories):
        new_trajectory()
    n_events = 0
    while timed < decisions:
        now, _, what, tid = heapq.heappop(events)
        n_events += 1
        if n_events % case.admit_refresh == 1:
            open_gate = {name: rng.random() < case.admit_p for name in serving}
            for name in serving:
                push(name)
        if what == "ready":
            if not try_place(tid):
                queue.append(tid)
                queued += 1
            continue
        worker = router.placements(tid)[-1].worker
        t0 = clock()
        router.on_turn_end(tid, worker)
        push(worker)
        book_ns.append(clock() - t0)
        turns_left[tid] -= 1
        if turns_left[tid] == 0:
            router.forget(tid)
            del turns_left[tid]
            new_trajectory()
        else:  # environment step, then the next turn is ready
            seq += 1
            heapq.heappush(events, (now + 0.2 * rng.random(), seq, "ready", tid))
        for _ in range(min(2, len(queue))):  # the freed slot: retry the head of the queue
            head = queue.popleft()
            if not try_place(head):
                queue.append(head)
                break
    us = route_ns / 1e3
    book = np.asarray(book_ns) / 1e3
    return {
        "case": asdict(case),
        "decisions": int(timed),
        "route_us": {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
                     "p99.9": float(np.percentile(us, 99.9)), "max": float(us.max()),
                     "mean": float(us.mean())},
        "bookkeeping_us": {"p50": float(np.percentile(book, 50)), "p99": float(np.percentile(book, 99)),
                           "max": float(book.max())},
        "turns_placed": int(placed),
        "serving_share": placed_serving / max(1, placed),
        "affinity_share": affine / max(1, placed),
        "queued_turns": int(queued),
        "queue_at_end": len(queue),
    }


def print_latency_table(rows: list[dict], console: Console) -> None:
    table = Table(title="Routing decision latency (route(), perf_counter_ns), microseconds")
    for col in ("case", "workers", "in flight", "decisions", "p50", "p99", "p99.9", "max",
                "gc max", "book p99", "on serving", "affine"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        c, lat = r["case"], r["route_us"]
        table.add_row(
            c["name"], f"{c['rollout_workers']}+{c['serving_workers']}", f"{c['trajectories']:,}",
            f"{r['decisions']:,}", f"{lat['p50']:.1f}", f"{lat['p99']:.1f}", f"{lat['p99.9']:.1f}",
            f"{lat['max']:.0f}", f"{r['gc_pause_ms']['max'] * 1e3:.0f}",
            f"{r['bookkeeping_us']['p99']:.1f}", f"{r['serving_share']:.0%}", f"{r['affinity_share']:.0%}",
        )
    console.print(table)


def latency_bench(decisions: int, seed: int, console: Console) -> dict:
    rows = [run_latency(case, decisions, seed) for case in latency_cases()]
    print_latency_table(rows, console)
    goal = rows[0]["route_us"]["p99"] < 1000.0
    console.print(f"headline p99 {rows[0]['route_us']['p99']:.1f} us; goal p99 < 1 ms: "
                  f"{'[green]met' if goal else '[red]missed'}")
    payload = {"python": platform.python_version(), "machine": platform.machine(),
               "cpus": os.cpu_count(), "seed": seed, "gc_enabled": gc.isenabled(),
               "goal_p99_us": 1000.0, "goal_met": goal, "rows": rows}
    write_json(RESULTS / "scheduler_latency.json", payload)
    return payload


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=200_000, help="timed route() calls per case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ablation", action="store_true",
                        help="run the ablation on the local stack instead of the latency bench")
    parser.add_argument("--reps", type=int, default=3, help="ablation: repetitions per case")
    parser.add_argument("--groups", type=int, default=8, help="ablation: GRPO groups per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--cap", type=int, default=16, help="ablation: trajectories per worker")
    parser.add_argument("--lent", choices=("auto", "serving", "rollout"), default="auto",
                        help="ablation: the lent worker is a co-serving executor (auto: when "
                             "executors/coserving/executor.py has its plugin) or a second rollout worker")
    args = parser.parse_args(argv)
    console = Console(width=150)
    if args.ablation:
        from bench.stack.scheduler_ablation import ablation_bench

        ablation_bench(args.reps, args.groups, args.group_size, args.cap, console, write_json,
                       args.lent)
        return
    if args.decisions < 100:
        raise SystemExit("--decisions must be >= 100 for a meaningful p99")
    latency_bench(args.decisions, args.seed, console)


if __name__ == "__main__":
    main()
