"""Co-serving acceptance benchmark: one serving worker under a replayed burst of the
Azure code trace, with a steady stream of rollout turns, in every configuration of the paper's
Tables 1 and 2, plus a dedicated rollout worker for the harvested share.

    .venv/bin/python -m bench.coserving.coserving            # full: ~12-15 min on 2 cores (profiles cached)
    .venv/bin/python -m bench.coserving.coserving --quick    # smoke: ~2-3 min, 4 configurations

Scaling (explicit; printed and written to the JSON): the 600 s trace window centred on the
busiest second (67 requests, 26x the mean rate), every other request kept (seeded), replayed
8x faster (time x0.125 -> 75 s), prompts x1/16 (the tiny serving model's 2048-token context
and a CPU's prefill speed), output lengths as in the trace, EOS ignored.
Each configuration runs in its own process (fresh engines, no leftovers): serving alone first,
whose P99s fix the SLOs of the others (--slo-factor x P99, unless --slo-ttft/--slo-tpot given),
then the dedicated rollout worker (the rollout engine alone, same turn stream, same duration),
then the co-serving configurations. Results: bench/results/coserving.json (with the trace NOTICE).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.lib.results import RESULTS, ROOT, write_json
from replay.replayer import RequestRecord, summarize
from core.trace import (DEFAULT_TRACE, Scaling, busiest_bin, load_trace,
                              peak_window_start, plan, trace_notice)

CONFIGS = [  # (mode, label, table group)
    ("serving_only", "serving alone", "reference"),
    ("dedicated", "dedicated rollout worker", "reference"),
    ("static_partition", "static 50/50 partition", "ablation (Table 2)"),
    ("preemption", "+ memory preemption", "ablation (Table 2)"),
    ("prefix", "+ prefix caching", "ablation (Table 2)"),
    ("rose", "+ dual-SLO admission (ROSE)", "ablation (Table 2)"),
    ("unaware", "SLO-unaware multiplexing", "baselines (Table 1)"),
    ("evict_reload", "evict/reload autoscaling", "baselines (Table 1)"),
]
QUICK = ("serving_only", "dedicated", "rose", "unaware")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="120 s window, 4 configurations")
    ap.add_argument("--configs", default=None, help="comma-separated modes (default: all)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE,
                    help="serving trace: Azure LLM inference, BurstGPT CSV, Mooncake JSONL or a CSV with "
                         "arrival_s, prompt_tokens, output_tokens (core/trace.py FORMATS)")
    ap.add_argument("--window-s", type=float, default=600.0, help="trace seconds around the peak")
    ap.add_argument("--time-scale", type=float, default=0.125, help="replay s per trace s")
    ap.add_argument("--length-scale", type=float, default=1 / 16, help="prompt scale")
    ap.add_argument("--output-scale", type=float, default=1.0, help="output length scale")
    ap.add_argument("--sample", type=float, default=0.5, help="fraction of requests kept")
    ap.add_argument("--trajectories", type=int, default=16, help="rollout trajectories at once")
    ap.add_argument("--obs-tokens", type=int, default=200, help="new tokens per turn (tool output)")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="dedicated worker warm-up")
    ap.add_argument("--turn-tokens", type=int, default=32)
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--step-s", type=float, default=15.0, help="RL step length (start_step)")
    ap.add_argument("--kv-blocks", type=int, default=1024,
                    help="emulated device KV pool in serving blocks (~3x serving's peak here)")
    ap.add_argument("--slo-ttft", type=float, default=None, help="TTFT SLO (s)")
    ap.add_argument("--slo-tpot", type=float, default=None, help="TPOT SLO (s)")
    ap.add_argument("--slo-factor", type=float, default=2.0,
                    help="SLO = factor x serving-alone P99 when not given")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", action="store_true",
                    help="harvest across loads (bench/coserving/coserving_sweep.py); --quick: shorter loads")
    ap.add_argument("--sweep-s", type=float, default=None, help="replay seconds per sweep load")
    ap.add_argument("--loads", default=None,
                    help="sweep: comma-separated load names to run (e.g. 'chat 30%%,bursty'; default: all)")
    ap.add_argument("--scales-from", type=Path, default=None,
                    help="sweep: reuse the load rates a previous sweep JSON calibrated (no calibration)")
    ap.add_argument("--min-requests", type=int, default=100,
                    help="sweep: serving requests per load point at least (its window grows)")
    ap.add_argument("--chat-output-median", type=float, default=129.0,
                    help="sweep's chat load: generated tokens, median (public chat traffic)")
    ap.add_argument("--chat-output-mean", type=float, default=211.0, help="... and mean")
    ap.add_argument("--chat-prompt-median", type=float, default=1020.0,
                    help="sweep's chat load: prompt tokens before --length-scale, median")
    ap.add_argument("--chat-prompt-mean", type=float, default=1350.0, help="... and mean")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--single", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.single:  # before anything runs: a trace's attribution travels with its results
        if not args.trace.is_file():
            ap.error(f"--trace {args.trace}: no such file")
        if not args.trace.with_name("NOTICE.md").is_file():  # a user's own trace: said, not refused
            print(f"note: no NOTICE.md beside --trace {args.trace}; the results will say its source "
                  "and terms are not recorded", file=sys.stderr)
        try:
            load_trace(args.trace)
        except ValueError as e:
            ap.error(f"--trace: {e}")
    if args.sweep:
        args.sweep_s = args.sweep_s or (12.0 if args.quick else 20.0)
        if args.scales_from is not None:
            try:
                args.scales = json.loads(args.scales_from.read_text())["scales"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                ap.error(f"--scales-from {args.scales_from}: no sweep's 'scales' there ({e})")
        if args.loads:
            args.loads = [x.strip() for x in args.loads.split(",") if x.strip()]
            from bench.coserving.coserving_sweep import load_names
            known = list(getattr(args, "scales", None) or load_names())
            unknown = [x for x in args.loads if x not in known]
            if unknown:
                ap.error(f"--loads: unknown load(s) {unknown}; the sweep's loads are {known}")
    if args.quick:
        args.window_s = 120.0 if args.window_s == 600.0 else args.window_s
        args.configs = args.configs or (None if args.sweep else ",".join(QUICK))
    return args


def workload(args) -> tuple[list, dict]:
    """The replayed requests and a description of how they were scaled."""
    trace = load_trace(args.trace)
    t0 = peak_window_start(trace, args.window_s)
    window = trace.window(t0, args.window_s)
    scaling = Scaling(args.time_scale, args.length_scale, args.output_scale, args.sample,
                      2048, args.seed)
    reqs = plan(window, scaling, start_s=t0)
    peak_at, peak_n = busiest_bin(trace)
    prompts = sorted(r.prompt_len for r in reqs)
    desc = {"trace": str(args.trace), "window_start_s": t0, "window_s": args.window_s,
            "busiest_second_at_s": peak_at, "busiest_second_requests": peak_n,
            "window_requests": len(window), "replayed_requests": len(reqs),
            "time_scale": args.time_scale, "speedup": 1 / args.time_scale,
            "replay_s": args.window_s * args.time_scale, "length_scale": args.length_scale,
            "output_scale": args.output_scale, "sample": args.sample, "seed": args.seed,
            "prompt_p50": prompts[len(prompts) // 2], "prompt_max": prompts[-1],
            "output_tokens": sum(r.max_tokens for r in reqs), "eos_ignored": True}
    return reqs, desc


# ---- one configuration, in its own process ----

def run_single(mode: str, spec: dict) -> dict:
    import asyncio

    from bench.coserving.rollout_stream import RolloutStream
    from core.config import ModelsConfig
    from replay.replayer import executor_sender, replay

    args = argparse.Namespace(**{k: (Path(v) if k == "trace" else v) for k, v in spec.items()})
    if args.sweep:
        return _run_sweep_single(mode, spec, args)
    reqs, _ = workload(args)
    models = ModelsConfig()
    serving_dir, policy_dir = models.serving_path(), models.policy_path()
    span = args.window_s * args.time_scale
    t_build = time.perf_counter()
    if mode == "dedicated":
        from executors.engine.vllm_engine import EngineLoop, EngineSpec

        worker = EngineLoop(EngineSpec(policy_dir), worker="rollout-0", worker_kind="rollout")
        submit, vocab = worker.submit, _vocab(policy_dir)
    else:
        from executors.coserving.executor import CoServingConfig, CoServingExecutor
        from executors.policies.slo_admission import SLOConfig

        slo = SLOConfig(spec["slo_ttft"], spec["slo_tpot"]) if spec.get("slo_ttft") else None
        cfg = CoServingConfig(serving_dir, policy_dir, mode=mode, slo=slo,
                              kv_blocks=args.kv_blocks, seed=args.seed)
        worker = CoServingExecutor(cfg, worker="serving-0")
        submit, vocab = worker.submit_rollout, _vocab(policy_dir)
    startup_s = time.perf_counter() - t_build
    stream = RolloutStream(submit, vocab, args.trajectories, obs_tokens=args.obs_tokens,
                           turn_tokens=args.turn_tokens, max_turns=args.max_turns, seed=args.seed)
    peaks = {"serving_used_blocks": 0, "rollout_used_blocks": 0}

    async def main():
        stop = asyncio.Event()
        rollout = (asyncio.create_task(stream.run(stop)) if mode != "serving_only" else None)
        side = [asyncio.create_task(_sample(worker, peaks, stop)),
                asyncio.create_task(_steps(worker, args.step_s, stop))] if mode != "dedicated" else []
        if mode == "dedicated":  # first turns pay one-off kernel setup; the executor's
            await asyncio.sleep(args.warmup_s)  # start-up profiling warmed its engines up
        t0 = time.monotonic()
        if mode == "dedicated":
            await asyncio.sleep(span)
            records = []
        else:
            records = await replay(reqs, executor_sender(worker), _vocab(serving_dir),
                                   args.seed, prompt_low=3)
        t1 = time.monotonic()
        stop.set()
        for task in side + ([rollout] if rollout else []):
            task.cancel()
        await asyncio.gather(*side, *([rollout] if rollout else []), return_exceptions=True)
        return records, t0, t1

    records, t0, t1 = asyncio.run(main())
    load = os.getloadavg()[0]  # other processes on the box skew every timing: say how busy
    metrics = worker.metrics() if mode != "dedicated" else {}
    worker.close()
    return {"mode": mode, "startup_s": startup_s, "wall_s": t1 - t0, "load_avg_1m": load,
            "records": [[r.ttft_s, r.tpot_s, r.output_tokens, r.ok, r.late_s] for r in records],
            # Over the arrivals' span (the burst included), the same length in every run.
            "rollout": stream.summary(t0, t0 + span) if mode != "serving_only" else None,
            "peaks": peaks, "executor": _slim(metrics)}


def _run_sweep_single(mode: str, spec: dict, args) -> dict:
    import asyncio

    from bench.coserving.coserving_sweep import drain, run_sweep_single
    from bench.coserving.rollout_stream import RolloutStream
    from core.config import ModelsConfig
    from replay.replayer import executor_sender, replay

    models = ModelsConfig()
    serving_dir, policy_dir = models.serving_path(), models.policy_path()

    def build(mode):
        if mode == "dedicated":
            from executors.engine.vllm_engine import EngineLoop, EngineSpec
            w = EngineLoop(EngineSpec(policy_dir), worker="rollout-0", worker_kind="rollout")
            return w, w.submit
        from executors.coserving.executor import CoServingConfig, CoServingExecutor
        cfg = CoServingConfig(serving_dir, policy_dir, mode=mode, kv_blocks=args.kv_blocks, seed=args.seed)
        w = CoServingExecutor(cfg, worker="serving-0")
        return w, w.submit_rollout

    def run_load(worker, submit, reqs, span, rollout):
        stream = RolloutStream(submit, _vocab(policy_dir), args.trajectories, obs_tokens=args.obs_tokens,
                               turn_tokens=args.turn_tokens, max_turns=args.max_turns, seed=args.seed)

        async def main():
            stop = asyncio.Event()
            task = asyncio.create_task(stream.run(stop)) if rollout else None
            # RL steps as the product has them: each re-sets the rollout KV budget and unfreezes
            steps = asyncio.create_task(_steps(worker, args.step_s, stop)) if mode != "dedicated" else None
            if mode == "dedicated":
                await asyncio.sleep(args.warmup_s)
            t0 = time.monotonic()
            if reqs:
                records = await replay(reqs, executor_sender(worker), _vocab(serving_dir), args.seed, prompt_low=3)
            else:
                records = []
            await asyncio.sleep(max(0.0, t0 + span - time.monotonic()))
            t1 = time.monotonic()
            stop.set()
            for t in (task, steps):
                if t:
                    t.cancel()
                    await asyncio.gather(t, return_exceptions=True)
            if mode != "dedicated":
                await drain(worker)
            return records, t0, t1

        records, t0, t1 = asyncio.run(main())
        summary = None
        if rollout:
            summary = stream.summary(t0, t1)
            ok = [st for st in stream.stats if t0 <= st.done_at <= t1 and st.ok]
            summary["cached_tokens"] = int(sum(st.cached_tokens for st in ok))
            summary["prompt_tokens"] = int(sum(st.prompt_tokens for st in ok))
        return [[r.ttft_s, r.tpot_s, r.output_tokens, r.ok, r.late_s] for r in records], summary

    return run_sweep_single(mode, spec, args, build, run_load)


def sweep_main(args, console: Console) -> None:
    import coserving_sweep as sw

    spec = {k: v for k, v in vars(args).items() if k not in ("single", "spec", "result", "out")}
    t_start = time.perf_counter()
    runs = {"serving_only": run_config("serving_only", spec, console)}
    spec["scales"] = runs["serving_only"]["scales"]
    spec["slos"] = sw.slos_from(runs["serving_only"], args.slo_factor)
    cal = runs["serving_only"]["calibration"]
    console.print((f"  loads' rates from {args.scales_from}" if cal.get("from") else
                   f"  calibration: busy {cal['busy_fraction']:.0%} (chat {cal['chat_busy_fraction']:.0%}) at "
                   f"{1 / sw.BASE_SCALE:g}x") + "; loads " + ", ".join(
                      f"{k}: {1 / v[0]:.1f}x, {v[1]:.0%} of arrivals" if k != "bursty"
                      else f"bursty: {v:.1f} req/s" for k, v in spec["scales"].items()))
    for name, (ttft, tpot) in spec["slos"].items():
        console.print(f"  SLO {name}: TTFT {ttft * 1e3:.0f} ms, TPOT {tpot * 1e3:.0f} ms "
                      f"({args.slo_factor:g} x serving-alone P99)")
    modes = args.configs.split(",") if args.configs else list(sw.SWEEP_CONFIGS)
    out = args.out or RESULTS / ("coserving_sweep_quick.json" if args.quick else "coserving_sweep.json")
    partial = out.with_suffix(".partial.json")  # each configuration's raw result as it lands
    for mode in [m for m in sw.SWEEP_CONFIGS if m in modes and m != "serving_only"]:
        runs[mode] = run_config(mode, spec, console)
        sw.dump(partial, {"spec": spec, "runs": runs})
    doc = sw.report(runs, spec["slos"], args, console)
    doc.update(bench="coserving_sweep", quick=args.quick, sweep_s=args.sweep_s, slo_factor=args.slo_factor,
               rollout_stream={k: spec[k] for k in ("trajectories", "obs_tokens", "turn_tokens", "max_turns",
                                                    "step_s")},
               total_s=time.perf_counter() - t_start, trace_notice=trace_notice(args.trace, required=False),
               machine={"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
               runs={m: {k: v for k, v in r.items() if k != "loads"} for m, r in runs.items()})
    sw.dump(out, doc)
    partial.unlink(missing_ok=True)
    console.print(f"total {doc['total_s'] / 60:.1f} min; wrote {out}")


async def _sample(ex, peaks: dict, stop) -> None:
    import asyncio
    while not stop.is_set():
        m = ex.metrics()
        peaks["serving_used_blocks"] = max(peaks["serving_used_blocks"],
                                           m.get("serving", {}).get("used_blocks", 0))
        peaks["rollout_used_blocks"] = max(peaks["rollout_used_blocks"],
                                           m.get("rollout", {}).get("used_blocks", 0))
        await asyncio.sleep(0.05)


async def _steps(ex, step_s: float, stop) -> None:
    import asyncio
    while not stop.is_set():  # a new RL step: fresh rollout budget, unfreeze
        await asyncio.sleep(step_s)
        await asyncio.to_thread(ex.start_step)


def _vocab(model_dir: Path) -> int:
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def _slim(metrics: dict) -> dict:
    keep = ("slo", "rollout", "kv", "loop", "serving")
    return {k: metrics[k] for k in keep if k in metrics}


# ---- the whole bench ----

def _records(raw: list) -> list[RequestRecord]:
    return [RequestRecord(i, 0.0, 0.0, late, 0, n, n, ttft, tpot, ttft, ok)
            for i, (ttft, tpot, n, ok, late) in enumerate(raw)]


def run_config(mode: str, spec: dict, console: Console) -> dict:
    with tempfile.TemporaryDirectory(prefix="rose-bench-") as tmp:
        spec_path, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec, default=str))
        t0 = time.perf_counter()
        # Passive OpenMP waiting: on a shared 2-core box, spinning OMP threads made engine
        # steps 20-30x slower (measured); it must be set before torch loads, hence here.
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        proc = subprocess.run([sys.executable, "-m", __spec__.name, "--single", mode, "--spec",
                               str(spec_path), "--result", str(result)],
                              capture_output=True, text=True, cwd=ROOT, env=env)
        if proc.returncode != 0 or not result.is_file():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise RuntimeError(f"configuration {mode} failed (exit {proc.returncode}):\n{tail}")
        out = json.loads(result.read_text())
    out["process_s"] = time.perf_counter() - t0
    console.print(f"  {mode}: {out['process_s']:.0f} s (engines {out['startup_s']:.0f} s)")
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.single:
        res = run_single(args.single, json.loads(args.spec.read_text()))
        args.result.write_text(json.dumps(res, default=str))
        return
    console = Console(width=None if Console().is_terminal else 160)
    from core.config import ModelsConfig

    for path in (ModelsConfig().serving_path(), ModelsConfig().policy_path()):
        if not (path / "config.json").is_file():  # any build will do: the bench times engines
            raise SystemExit(f"no model in {path}: run `rose models build` (ROSE_DATA_DIR)")
    if args.sweep:
        return sweep_main(args, console)
    reqs, desc = workload(args)
    modes = args.configs.split(",") if args.configs else [m for m, _, _ in CONFIGS]
    unknown = set(modes) - {m for m, _, _ in CONFIGS}
    if unknown:
        raise SystemExit(f"unknown configurations {sorted(unknown)}")
    if "serving_only" not in modes and not (args.slo_ttft and args.slo_tpot):
        raise SystemExit("without serving_only, give --slo-ttft and --slo-tpot")
    w0 = desc["window_start_s"]
    console.print(f"trace window [{w0:.0f}, {w0 + args.window_s:.0f}) s (busiest second at "
                  f"{desc['busiest_second_at_s']:.0f} s: {desc['busiest_second_requests']} "
                  f"requests) -> {len(reqs)} requests over {desc['replay_s']:.0f} s "
                  f"({desc['speedup']:g}x faster, sample {args.sample:g}); prompts x{args.length_scale:g} "
                  f"(p50 {desc['prompt_p50']}, max {desc['prompt_max']}), outputs x{args.output_scale:g}")
    spec = {k: v for k, v in vars(args).items() if k not in ("single", "spec", "result", "out")}
    runs, t_start = {}, time.perf_counter()
    for mode in sorted(modes, key=[m for m, _, _ in CONFIGS].index):
        if mode != "serving_only" and not spec.get("slo_ttft"):
            alone = summarize(_records(runs["serving_only"]["records"]))
            spec["slo_ttft"] = max(0.05, args.slo_factor * alone["ttft_p99_s"])
            spec["slo_tpot"] = max(0.02, args.slo_factor * alone["tpot_p99_s"])
            console.print(f"  SLOs: TTFT {spec['slo_ttft'] * 1e3:.0f} ms, TPOT "
                          f"{spec['slo_tpot'] * 1e3:.0f} ms ({args.slo_factor:g} x serving-alone P99)")
        runs[mode] = run_config(mode, spec, console)
    doc = report(runs, spec, desc, args, console, time.perf_counter() - t_start)
    out = args.out or RESULTS / ("coserving_quick.json" if args.quick else "coserving.json")
    write_json(out, doc, default=str)


def report(runs: dict, spec: dict, desc: dict, args, console: Console, total_s: float) -> dict:
    slo_ttft, slo_tpot = spec.get("slo_ttft"), spec.get("slo_tpot")
    # Rollout throughput as the paper counts it: (input + output tokens) / time.
    dedicated = (runs.get("dedicated", {}).get("rollout") or {}).get("total_tokens_per_s")
    table = Table(title=f"Co-serving under the Azure code trace burst (SLO: TTFT {slo_ttft * 1e3:.0f} ms, "
                        f"TPOT {slo_tpot * 1e3:.0f} ms, P99)")
    for col in ("configuration", "TTFT P95", "TTFT P99", "TPOT P95", "TPOT P99", "SLO attained",
                "rollout tok/s (in+out)", "turn P50", "harvested", "aborted turns"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    rows, group = {}, None
    for mode, label, grp in CONFIGS:
        if mode not in runs:
            continue
        run = runs[mode]
        s = summarize(_records(run["records"]), slo_ttft, slo_tpot) if run["records"] else {}
        r = run.get("rollout") or {}
        share = (r["total_tokens_per_s"] / dedicated) if (dedicated and r) else None
        rows[mode] = {"label": label, "serving": s, "rollout": r, "harvested_share": share,
                      "startup_s": run["startup_s"], "wall_s": run["wall_s"],
                      "load_avg_1m": run.get("load_avg_1m"),
                      "peaks": run["peaks"], "executor": run["executor"]}
        if grp != group:
            table.add_section() if group else None
            group = grp
        ms = lambda k: "-" if s.get(k) is None else f"{s[k] * 1e3:.0f} ms"  # noqa: E731
        ok99 = s and s.get("ttft_p99_s", 0) <= slo_ttft and s.get("tpot_p99_s", 0) <= slo_tpot
        p99 = lambda k: ms(k) if ok99 or not s else f"[red]{ms(k)}[/]"  # noqa: E731
        table.add_row(label, ms("ttft_p95_s"), p99("ttft_p99_s"), ms("tpot_p95_s"), p99("tpot_p99_s"),
                      "-" if "slo_attainment" not in s else f"{s['slo_attainment']:.1%}",
                      "-" if not r else f"{r['total_tokens_per_s']:.0f}",
                      "-" if not r.get("turn_latency_p50_s") else f"{r['turn_latency_p50_s']:.2f} s",
                      "-" if share is None else f"{share:.0%}",
                      "-" if not r else str(r["aborted_turns"]))
    console.print(table)
    console.print(f"total {total_s / 60:.1f} min; rollout stream: {args.trajectories} trajectories, "
                  f"{args.obs_tokens}-token observations, {args.turn_tokens}-token turns, "
                  f"{args.max_turns} turns; RL step every {args.step_s:g} s")
    return {"bench": "coserving", "quick": args.quick, "workload": desc,
            "slo": {"ttft_s": slo_ttft, "tpot_s": slo_tpot,
                    "source": "given" if args.slo_ttft else f"{args.slo_factor:g} x serving-alone P99"},
            "rollout_stream": {k: spec[k] for k in ("trajectories", "obs_tokens", "turn_tokens",
                                                    "max_turns", "step_s")},
            "configs": rows, "total_s": total_s,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_avg": os.getloadavg()},
            "trace_notice": trace_notice(args.trace, required=False)}


if __name__ == "__main__":
    main()
