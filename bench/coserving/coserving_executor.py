"""The co-serving executor on its own: profiles, step latencies, control-loop overhead, per mode.

    ROSE_DATA_DIR=/tmp/me .venv/bin/python -m bench.coserving.coserving_executor [--modes rose,unaware]
        [--seconds 20] [--kv-blocks 256] [--rate 2] [--inflight 8] [--step-every 5]

Per mode: build the executor (profiles cached next to the models), then for --seconds run a
synthetic mix: Poisson serving arrivals at --rate (prompts 64-1024 tokens, 32 output tokens,
EOS ignored) with one burst of six 1024-token prompts at a third of the run, and a closed loop
of --inflight rollout turns (prompts 256-768, up to 32 tokens; aborted turns are resubmitted);
start_step() every --step-every seconds stands for the RL step boundary.
This is not the trace replay (bench/coserving/coserving.py); it measures the executor's own machinery.
Prints a table and writes bench/results/coserving_executor.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import threading
import time
from pathlib import Path


import numpy as np
from rich.console import Console
from rich.table import Table


from bench.lib.results import RESULTS, write_json
PREBUILT = Path(os.environ.get("ROSE_PREBUILT_MODELS", "/tmp/rd/models"))


def models_dir() -> Path:
    from core.config import ModelsConfig
    from rose.models.build import build_models

    cfg = ModelsConfig()
    if not (cfg.policy_path() / "config.json").is_file():
        if (PREBUILT / "policy" / "config.json").is_file():
            import shutil
            shutil.copytree(PREBUILT, cfg.policy_path().parent, dirs_exist_ok=True)
        else:
            build_models(cfg)
    return cfg.policy_path().parent


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) as np.percentile computes it everywhere else (linear), nan if empty."""
    return float(np.percentile(xs, 100 * q)) if xs else float("nan")


def run_mode(mode: str, models: Path, seconds: float, kv_blocks: int, step_every: float,
             rate: float = 2.0, inflight: int = 8, seed: int = 0) -> dict:
    from executors.coserving.executor import CoServingConfig, CoServingExecutor
    from executors.turns import TurnRequest

    rng = random.Random(seed)
    t0 = time.perf_counter()
    ex = CoServingExecutor(CoServingConfig(models / "serving", models / "policy", mode=mode,
                                           kv_blocks=kv_blocks, max_num_seqs=32))
    build_s = time.perf_counter() - t0
    inflight_turns = inflight
    serving, turns = [], {"done": 0, "aborted": 0, "tokens": 0, "latency": []}
    stop = time.monotonic() + seconds

    def feed_rollout() -> None:  # a closed loop of turns (own thread: never the loop's)
        inflight, n, n_turns = [], 0, inflight_turns
        while time.monotonic() < stop:
            while len(inflight) < n_turns:
                n += 1
                prompt = [rng.randrange(3, 400) for _ in range(rng.randint(256, 768))]
                req = TurnRequest(f"b{n}/t0/a0", f"b{n}", prompt, 32, seed=n)
                inflight.append((time.monotonic(), ex.submit_rollout(req)))
            time.sleep(0.01)
            for sent, fut in [x for x in inflight if x[1].done()]:
                inflight.remove((sent, fut))
                r = fut.result()
                if r.ok:
                    turns["done"] += 1
                    turns["tokens"] += len(r.response_ids)
                    turns["latency"].append(time.monotonic() - sent)
                else:
                    turns["aborted"] += 1
        for _, fut in inflight:
            fut.result(timeout=300)

    feeder = threading.Thread(target=feed_rollout, daemon=True)
    if mode != "serving_only":
        feeder.start()
    start, burst_at, burst_sent = time.monotonic(), time.monotonic() + seconds / 3, False
    next_step = start + step_every
    while time.monotonic() < stop:
        if time.monotonic() >= next_step:  # a new RL step: budget from recent serving usage
            ex.start_step()
            next_step += step_every
        if not burst_sent and time.monotonic() >= burst_at:
            serving += [ex.submit_serving([rng.randrange(3, 400) for _ in range(1024)], 32, ignore_eos=True)
                        for _ in range(6)]
            burst_sent = True
        serving.append(ex.submit_serving([rng.randrange(3, 400) for _ in range(rng.randint(64, 1024))],
                                         32, ignore_eos=True))
        time.sleep(rng.expovariate(rate))
    results = [f.result(timeout=300) for f in serving]
    elapsed = time.monotonic() - start
    if feeder.is_alive():
        feeder.join(timeout=300)
    time.sleep(0.5)
    m = ex.metrics(fresh=True)
    ex.close()
    ttft = [r.ttft_s for r in results]
    tpot = [r.tpot_s for r in results if r.tpot_s == r.tpot_s]
    slo = m["slo"]
    ok = sum(r.ttft_s <= slo["ttft_s"] and (r.tpot_s != r.tpot_s or r.tpot_s <= slo["tpot_s"])
             for r in results)
    return {"mode": mode, "build_s": build_s, "seconds": elapsed, "serving_requests": len(results),
            "ttft_p50_ms": 1e3 * pct(ttft, 0.5), "ttft_p99_ms": 1e3 * pct(ttft, 0.99),
            "tpot_p50_ms": 1e3 * pct(tpot, 0.5), "tpot_p99_ms": 1e3 * pct(tpot, 0.99),
            "slo_attainment": ok / max(1, len(results)), "slo": slo,
            "rollout_turns": turns["done"], "rollout_aborted": turns["aborted"],
            "rollout_tokens_per_s": turns["tokens"] / elapsed,
            "rollout_processed_tokens_per_s": m["rollout"]["scheduled_tokens"] / elapsed,
            "turn_latency_p50_s": pct(turns["latency"], 0.5),
            "serving_step_ms": m["serving"]["mean_step_ms"], "rollout_step_ms": m["rollout"]["mean_step_ms"],
            "rollout_predicted_ms": m["rollout"]["mean_predicted_ms"],
            "rollout_abs_error_ms": m["rollout"]["mean_abs_error_ms"],
            "loop_overhead_us": m["loop"]["mean_overhead_us"], "decide_us": m["loop"]["mean_decide_us"],
            "iterations": m["loop"]["iterations"], "cuts": m["kv"].get("cuts", 0),
            "aborted_cut": m["rollout"]["aborted_cut"], "aborted_stall": m["rollout"]["aborted_stall"],
            "aborted_evict": m["rollout"]["aborted_evict"], "reload_s": m["rollout"]["reload_s"],
            "denied": m["rollout"]["denied"], "empty_steps": m["rollout"]["empty_steps"],
            "leases_reclaimed": m["rollout"]["leases_reclaimed"], "profiles": m["profiles"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="serving_only,rose,unaware,static_partition,evict_reload")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--kv-blocks", type=int, default=256)
    ap.add_argument("--step-every", type=float, default=5.0, help="seconds between start_step()")
    ap.add_argument("--rate", type=float, default=2.0, help="serving requests per second")
    ap.add_argument("--inflight", type=int, default=8, help="rollout turns kept in flight")
    args = ap.parse_args()
    console = Console()
    models = models_dir()
    rows = []
    for mode in args.modes.split(","):
        with console.status(f"{mode}: build + {args.seconds:.0f} s of traffic"):
            rows.append(run_mode(mode, models, args.seconds, args.kv_blocks, args.step_every,
                                 args.rate, args.inflight))
    table = Table(title="co-serving executor (synthetic mix; ms unless noted)")
    cols = ("mode", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "slo_attainment",
            "rollout_processed_tokens_per_s", "rollout_turns", "rollout_aborted", "serving_step_ms",
            "rollout_step_ms", "rollout_predicted_ms", "loop_overhead_us", "decide_us", "build_s")
    for c in cols:
        table.add_column(c.replace("_", " "), justify="right")
    for r in rows:
        table.add_row(*[r[c] if isinstance(r[c], str) else f"{r[c]:.3g}" for c in cols])
    console.print(table)
    console.print("profiles (ms):", json.dumps(rows[0]["profiles"], indent=1))
    RESULTS.mkdir(exist_ok=True)
    out = {"machine": {"cpu": platform.processor(), "cores": os.cpu_count(),
                       "loadavg_at_end": os.getloadavg()}, "args": vars(args), "rows": rows}
    write_json(RESULTS / "coserving_executor.json", out, default=str)
    console.print(f"(median of nothing: one run; "
                  f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
