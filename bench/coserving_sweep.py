"""`bench/coserving.py --sweep`: harvest at a measured SLO across serving loads.

Loads: the Azure code trace (prompts x1/16, outputs as in the trace) replayed for --sweep-s
seconds from trace second 600 at rates set in the same run so that the serving-alone busy
fraction (serving engine busy time / wall time) lands near 10/30/50/80%. A rate below the
calibration's (2x the trace) keeps the calibration's time scale and keeps a seeded fraction of
the requests (the same trace seconds, fewer requests: a low load is not a 3-request sliver of
the trace); a rate above it replays faster. Busy is not proportional to rate (decode steps are
shared by concurrent requests; a long request keeps the engine stepping), so each load's rate
is measured once at busy ~ rate and, if its busy fraction is more than 25% off its target,
corrected once from the measured fraction and measured again (the second is the one used).
Plus a synthetic bursty load (gamma inter-arrivals, CV 4, the 30% load's mean rate, lengths
drawn from the trace). Per load, the SLO is 2x the serving-alone P99 (TTFT and TPOT), printed.
One process per configuration; its engines run every load in turn (a fresh rollout stream each,
in-flight turns drained between loads). Harvest = co-served rollout tok/s (in+out) / a dedicated
rollout worker's; harvest efficiency = harvest / (1 - busy fraction).
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np

from rose.serve.trace import ReplayRequest, Scaling, load_trace, plan

SWEEP_CONFIGS = ("serving_only", "dedicated", "static_partition", "unaware", "prefix", "rose")
TARGETS = (0.1, 0.3, 0.5, 0.8)
BASE_SCALE = 0.5  # calibration: 2x faster than the trace
START_S = 600.0  # trace seconds: past the first minutes' ramp-up
RETRY_OFF = 0.25  # a load's busy fraction this far (relative) from its target is measured again


def trace_load(args, time_scale: float, duration_s: float, sample: float = 1.0) -> list[ReplayRequest]:
    trace = load_trace(args.trace)
    window = trace.window(START_S, duration_s / time_scale)
    return plan(window, Scaling(time_scale, args.length_scale, args.output_scale, sample, 2048, args.seed),
                start_s=START_S)


def rate_to_load(rate: float) -> tuple[float, float]:
    """(time scale, sample) for `rate` x the calibration's rate: below it, the same trace seconds
    with a seeded fraction of the requests; above it, every request replayed faster."""
    return (BASE_SCALE, rate) if rate <= 1 else (BASE_SCALE / rate, 1.0)


def bursty_load(args, rate: float, duration_s: float, cv: float = 4.0) -> list[ReplayRequest]:
    """Gamma inter-arrivals (shape 1/cv^2: CV = cv) at `rate` req/s; lengths from the trace."""
    rng = np.random.default_rng(args.seed + 1)
    pool = trace_load(args, BASE_SCALE, duration_s * 4)  # lengths only
    shape = 1 / cv ** 2
    gaps = rng.gamma(shape, 1 / (rate * shape), size=int(rate * duration_s * 4) + 16)
    at = np.cumsum(gaps) - gaps[0]
    at = at[at < duration_s]
    picks = rng.integers(0, len(pool), len(at))
    return [ReplayRequest(i, int(p), float(t), float(t), pool[p].prompt_len, pool[p].max_tokens,
                          pool[p].context_tokens, pool[p].generated_tokens)
            for i, (t, p) in enumerate(zip(at, picks))]


def loads_for(args, scales: dict) -> dict[str, list[ReplayRequest]]:
    out = {name: trace_load(args, s[0], args.sweep_s, s[1]) for name, s in scales.items() if name != "bursty"}
    out["bursty"] = bursty_load(args, scales["bursty"], args.sweep_s)
    return out


def _busy(worker) -> tuple[float, dict]:
    m = worker.metrics(fresh=True)
    return m["serving"]["steps"] * m["serving"]["mean_step_ms"] / 1e3, m


def _set_slo(worker, ttft: float, tpot: float) -> None:
    """The per-load SLO, swapped on the executor's loop thread (between loads, nothing live)."""
    from executors.policies.slo_admission import SLOConfig

    def swap():
        worker.slo = SLOConfig(ttft, tpot)
        worker.admission = worker.new_admission()
    worker._call(swap)


def _counters(m: dict) -> dict:
    r = m.get("rollout", {})
    return {"admitted": r.get("admitted", 0), "denied": sum((r.get("denied") or {}).values()),
            "denied_by": dict(r.get("denied") or {}),
            **{k: r.get(k, 0) for k in ("aborted_cut", "aborted_stall", "aborted_evict", "aborted_other",
                                        "empty_steps", "steps", "stall_kept", "finished",
                                        "aborted_started", "returned_unstarted")}}


def _delta(a: dict, b: dict) -> dict:
    out = {k: b[k] - a[k] for k in b if isinstance(b[k], (int, float))}
    out["denied_by"] = {k: v - a["denied_by"].get(k, 0) for k, v in b["denied_by"].items()}
    return out


def run_sweep_single(mode: str, spec: dict, args, build, run_load) -> dict:
    """All loads on one pair of engines. `build()` -> (worker, submit); `run_load(worker, submit,
    reqs, span, stream)` -> (records, rollout summary)."""
    t0 = time.perf_counter()
    worker, submit = build(mode)
    startup = time.perf_counter() - t0
    out = {"mode": mode, "startup_s": startup, "loads": {}}
    if mode == "dedicated":
        _, summary = run_load(worker, submit, [], args.sweep_s, True)
        out["rollout"] = summary
        worker.close()
        return out
    scales, done = spec.get("scales"), {}
    if mode == "serving_only":  # its calibration's last measurement of a load is that load's row
        scales, out["calibration"], done = calibrate(worker, submit, args, run_load)
        out["scales"] = scales
    for name, reqs in loads_for(args, scales).items():
        slo = (spec.get("slos") or {}).get(name)
        if slo:
            _set_slo(worker, *slo)
        out["loads"][name] = done.get(name) or measure(worker, submit, run_load, reqs, args.sweep_s,
                                                       mode != "serving_only", slo)
    worker.close()
    return out


def measure(worker, submit, run_load, reqs, span, rollout: bool, slo=None) -> dict:
    """One load on the worker: its records, rollout summary, busy fraction, executor counters."""
    b0, m0 = _busy(worker)
    t = time.monotonic()
    records, summary = run_load(worker, submit, reqs, span, rollout)
    wall = time.monotonic() - t
    b1, m1 = _busy(worker)
    return {"requests": len(reqs), "wall_s": wall, "busy_fraction": (b1 - b0) / wall,
            "records": records, "rollout": summary, "slo": slo,
            "executor": _delta(_counters(m0), _counters(m1)), "slowdown": m1.get("slo", {}).get("slowdown")}


def calibrate(worker, submit, args, run_load) -> tuple[dict, dict, dict]:
    """Rate per target busy fraction: busy measured at 2x the trace, each target's rate set from
    it (busy ~ rate), measured, and corrected once when more than RETRY_OFF off.
    Returns (scales, what was tried, each trace load's last measurement)."""
    first = measure(worker, submit, run_load, trace_load(args, BASE_SCALE, args.sweep_s), args.sweep_s, False)
    frac = first["busy_fraction"]
    cal = {"time_scale": BASE_SCALE, "busy_fraction": frac, "tries": {}}
    scales, done = {}, {}
    for x in TARGETS:
        name, rate, tries = f"trace {int(100 * x)}%", x / max(frac, 1e-3), []
        for attempt in range(2):
            load = rate_to_load(rate)
            done[name] = measure(worker, submit, run_load, trace_load(args, load[0], args.sweep_s, load[1]),
                                 args.sweep_s, False)
            busy = done[name]["busy_fraction"]
            tries.append({"rate": rate, "time_scale": load[0], "sample": load[1], "busy_fraction": busy})
            if abs(busy - x) <= RETRY_OFF * x or attempt:
                break
            rate *= min(4.0, max(0.25, x / max(busy, 1e-3)))
        scales[name] = rate_to_load(rate)
        cal["tries"][name] = tries
    load30 = scales["trace 30%"]
    scales["bursty"] = len(trace_load(args, load30[0], args.sweep_s, load30[1])) / args.sweep_s
    return scales, cal, done


async def drain(worker, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and worker.metrics(fresh=True).get("rollout", {}).get("in_flight", 0):
        await asyncio.sleep(0.05)


def report(runs: dict, slos: dict, args, console) -> dict:
    from rich.table import Table

    from rose.serve.replay import RequestRecord, summarize

    def recs(raw):
        return [RequestRecord(i, 0.0, 0.0, late, 0, n, n, ttft, tpot, ttft, ok)
                for i, (ttft, tpot, n, ok, late) in enumerate(raw)]

    ded = runs["dedicated"]["rollout"]["total_tokens_per_s"]
    alone = runs["serving_only"]["loads"]
    table = Table(title=f"Co-serving sweep: SLO = 2x serving-alone P99 per load; dedicated rollout "
                        f"{ded:.0f} tok/s (in+out); {args.sweep_s:g} s per load")
    cols = ("load", "busy", "SLO TTFT/TPOT", "config", "TTFT P99", "TPOT P99", "attained",
            "rollout tok/s", "harvest", "harv. eff.", "turns started", "aborted", "returned", "prefix-hit tok")
    for c in cols:
        table.add_column(c, justify="left" if c in ("load", "config") else "right")
    rows = []
    for load, base in alone.items():
        busy = base["busy_fraction"]
        slo = slos[load]
        table.add_section()
        for mode in ("serving_only", "static_partition", "unaware", "prefix", "rose"):
            if mode not in runs:
                continue
            L = runs[mode]["loads"][load]
            s = summarize(recs(L["records"]), *slo)
            r = L["rollout"] or {}
            harvest = r["total_tokens_per_s"] / ded if r else None
            eff = harvest / max(1e-9, 1 - busy) if harvest is not None else None
            # started: the engine computed some of it (finished, or aborted and its work lost);
            # a turn handed back before any of it ran is "returned" (rerouted, nothing lost)
            ex = L["executor"]
            started = ex.get("finished", 0) + ex.get("aborted_started", 0)
            hits = r.get("cached_tokens", 0) if r else 0
            row = {"load": load, "mode": mode, "busy_fraction": busy, "slo_ttft_s": slo[0],
                   "slo_tpot_s": slo[1], "ttft_p99_s": s["ttft_p99_s"], "tpot_p99_s": s["tpot_p99_s"],
                   "slo_attainment": s.get("slo_attainment"), "requests": s["requests"],
                   "rollout_tokens_per_s": r.get("total_tokens_per_s"), "harvest": harvest,
                   "harvest_efficiency": eff, "turns_started": started,
                   "turns_aborted": ex.get("aborted_started", 0),
                   "turns_returned_unstarted": ex.get("returned_unstarted", 0),
                   "stream_turns_ok": r.get("turns", 0), "stream_answered_abort": r.get("aborted_turns", 0),
                   "prefix_hit_tokens": hits, "prompt_tokens": r.get("prompt_tokens", 0) if r else 0,
                   "executor": L["executor"]}
            rows.append(row)
            ms = lambda v: "-" if v is None else f"{v * 1e3:.0f} ms"  # noqa: E731
            att = row["slo_attainment"]
            table.add_row(load, f"{busy:.0%}", f"{slo[0] * 1e3:.0f}/{slo[1] * 1e3:.0f} ms", mode,
                          ms(row["ttft_p99_s"]), ms(row["tpot_p99_s"]),
                          "-" if att is None else (f"{att:.1%}" if att >= 0.99 else f"[red]{att:.1%}[/]"),
                          "-" if harvest is None else f"{row['rollout_tokens_per_s']:.0f}",
                          "-" if harvest is None else f"{harvest:.0%}",
                          "-" if eff is None else f"{eff:.2f}",
                          "-" if harvest is None else str(started),
                          "-" if harvest is None else str(row["turns_aborted"]),
                          "-" if harvest is None else str(row["turns_returned_unstarted"]),
                          "-" if harvest is None else f"{hits:,}")
    console.print(table)
    return {"rows": rows, "scales": runs["serving_only"].get("scales"),
            "calibration": runs["serving_only"].get("calibration"), "dedicated": runs["dedicated"]["rollout"]}


def slos_from(alone: dict, factor: float) -> dict:
    from rose.serve.replay import RequestRecord, summarize

    out = {}
    for name, L in alone["loads"].items():
        recs = [RequestRecord(i, 0.0, 0.0, late, 0, n, n, ttft, tpot, ttft, ok)
                for i, (ttft, tpot, n, ok, late) in enumerate(L["records"])]
        s = summarize(recs)
        out[name] = (factor * s["ttft_p99_s"], factor * s["tpot_p99_s"])
    return out


def json_default(o):
    return str(o) if not isinstance(o, Path) else str(o)


def dump(path: Path, doc: dict) -> None:
    from storage.atomic import write_atomic
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, default=json_default))
