"""`python -m bench.coserving.coserving --sweep`: harvest at a measured SLO across serving loads.

Loads: the Azure code trace (prompts x1/16, outputs as in the trace) replayed for --sweep-s
seconds from trace second 600 (a fifth of the way into a shorter trace) at rates set in the
same run so that the serving-alone busy fraction (serving engine busy time / wall time) lands
near 10/30/50/80%. A rate below the calibration's (2x the trace) keeps the calibration's time
scale and keeps a seeded fraction of the requests (the same trace seconds, fewer requests: a
low load is not a 3-request sliver of the trace); a rate above it replays faster. Busy is not
proportional to rate (decode steps are shared by concurrent requests; a long request keeps the
engine stepping), so each load's rate is measured once at busy ~ rate and, if its busy fraction
is more than 25% off its target, corrected from the measured fraction and measured again, at
most twice (the last is the one used). A correction takes busy = 1 - exp(-rate x service time),
which a saturated engine (a long-output load at 90% busy) needs: busy ~ rate would barely move
the rate.
Plus a synthetic bursty load (gamma inter-arrivals, CV 4, the 30% load's mean rate, lengths
drawn from the trace), and a long-output conversation load ("chat"): the trace's arrival times,
prompts and outputs drawn from log-normals with the figures of public chat traffic (outputs
median 129, mean 211 tokens; prompts median ~1k tokens, scaled as the trace's), at rates set in
the same run for serving-alone busy near 30% and 80% (--chat-* options set other figures).
Every point replays at least --min-requests requests (its window grows where the rate is
low). Per load, the SLO is 2x the serving-alone P99 (TTFT and TPOT), printed.
One process per configuration; its engines run every load in turn (a fresh rollout stream each,
in-flight turns drained between loads). Harvest = co-served rollout tok/s (in+out) / a dedicated
rollout worker's; harvest efficiency = harvest / (1 - busy fraction).
"""
from __future__ import annotations

import asyncio
import functools
import math
import time
from pathlib import Path

import numpy as np

from core.trace import ReplayRequest, Scaling, Trace, load_trace, plan

SWEEP_CONFIGS = ("serving_only", "dedicated", "static_partition", "unaware", "prefix", "rose")
TARGETS = (0.3, 0.5, 0.8)  # 10% busy needs ~400 s a configuration for 100 requests
CHAT_TARGETS = (0.3, 0.8)
MAX_WINDOW_S = 400.0  # a point's replay window is grown for --min-requests up to this
CALIBRATION_MAX_S = 60.0  # ... and a calibration try's up to this
BASE_SCALE = 0.5  # calibration: 2x faster than the trace
START_S = 600.0  # trace seconds: past the first minutes' ramp-up (at most a fifth of the trace)
RETRY_OFF = 0.25  # a load's busy fraction this far (relative) from its target is measured again


def load_names() -> list[str]:
    """The sweep's load points by name, as its JSON rows name them."""
    return ([f"trace {int(100 * x)}%" for x in TARGETS] + [f"chat {int(100 * x)}%" for x in CHAT_TARGETS]
            + ["bursty"])


@functools.lru_cache(maxsize=4)
def _trace(path: Path) -> Trace:
    """The trace read once per process: a window grown for --min-requests plans it many times."""
    return load_trace(path)


def trace_load(args, time_scale: float, duration_s: float, sample: float = 1.0) -> list[ReplayRequest]:
    trace = _trace(Path(args.trace))
    start = min(START_S, 0.2 * trace.span_s)  # a short trace (another user's) starts earlier
    window = trace.window(start, duration_s / time_scale)
    return plan(window, Scaling(time_scale, args.length_scale, args.output_scale, sample, 2048, args.seed),
                start_s=start)


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


def lognormal(median: float, mean: float) -> tuple[float, float]:
    """(mu, sigma) of the log-normal with this median and mean (mean >= median)."""
    if not 0 < median <= mean:
        raise ValueError(f"a log-normal needs 0 < median <= mean, got {median}, {mean}")
    return math.log(median), math.sqrt(2 * math.log(mean / median))


def chat_load(args, time_scale: float, duration_s: float, sample: float = 1.0) -> list[ReplayRequest]:
    """Long-output conversation traffic: the trace's arrivals (its timing and burstiness), each
    request's prompt and output drawn (seeded) from the --chat-* log-normals; prompts scaled
    by --length-scale as the trace's are, outputs capped by the context."""
    arrivals = trace_load(args, time_scale, duration_s, sample)
    rng = np.random.default_rng(args.seed + 7)
    out_mu, out_sigma = lognormal(args.chat_output_median, args.chat_output_mean)
    in_mu, in_sigma = lognormal(args.chat_prompt_median, args.chat_prompt_mean)
    reqs = []
    for r in arrivals:
        ctx = max(1, int(rng.lognormal(in_mu, in_sigma)))
        gen = max(1, int(rng.lognormal(out_mu, out_sigma)))
        prompt = min(max(1, round(ctx * args.length_scale)), 2047)
        tokens = min(max(1, round(gen * args.output_scale)), 2048 - prompt)
        reqs.append(ReplayRequest(r.index, r.trace_row, r.trace_arrival_s, r.send_at_s, prompt, tokens,
                                  ctx, gen))
    return reqs


def window_for(make, time_scale: float, duration_s: float, sample: float, min_requests: int,
               most_s: float = MAX_WINDOW_S) -> float:
    """The shortest replay window (>= duration_s, at most `most_s`, in steps of a quarter of
    duration_s) holding at least `min_requests` requests at this rate. Counted, not extrapolated:
    a trace has lulls, so a longer window may add few requests."""
    span = duration_s
    while len(make(time_scale, span, sample)) < min_requests and span < most_s:
        span = min(most_s, span + duration_s / 4)
    return span


def _load(kind: str, args, scale: tuple[float, float], most_s: float = MAX_WINDOW_S) -> list[ReplayRequest]:
    make = (lambda ts, d, smp: chat_load(args, ts, d, smp)) if kind == "chat" else \
        (lambda ts, d, smp: trace_load(args, ts, d, smp))
    span = window_for(make, scale[0], args.sweep_s, scale[1], args.min_requests, most_s)
    return make(scale[0], span, scale[1])


def loads_for(args, scales: dict) -> dict[str, list[ReplayRequest]]:
    out = {name: _load("chat" if name.startswith("chat") else "trace", args, s)
           for name, s in scales.items() if name != "bursty"}
    if "bursty" not in scales:
        return out
    rate = scales["bursty"]
    out["bursty"] = bursty_load(args, rate, max(args.sweep_s, min(MAX_WINDOW_S, 1.1 * args.min_requests / rate)))
    return out


def span_of(reqs: list[ReplayRequest], sweep_s: float) -> float:
    """A load's replay window: the sweep's, or longer where it was grown for --min-requests."""
    return max(sweep_s, max((r.send_at_s for r in reqs), default=0.0) + 1.0)


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
            "denied_by": dict(r.get("denied") or {}), "step_sizes": dict(r.get("step_sizes") or {}),
            **{k: r.get(k, 0) for k in ("aborted_cut", "aborted_stall", "aborted_evict", "aborted_other",
                                        "empty_steps", "steps", "stall_kept", "finished",
                                        "aborted_started", "returned_unstarted", "start_declined")}}


def _delta(a: dict, b: dict) -> dict:
    out = {k: b[k] - a[k] for k in b if isinstance(b[k], (int, float))}
    for key in ("denied_by", "step_sizes"):
        out[key] = {k: v - a[key].get(k, 0) for k, v in b[key].items() if v - a[key].get(k, 0)}
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
    scales = spec.get("scales")
    if mode == "serving_only":
        if scales:  # --scales-from: a previous sweep's calibrated rates
            out["calibration"] = {"from": str(spec.get("scales_from")), "busy_fraction": None,
                                  "chat_busy_fraction": None}
        else:
            scales, out["calibration"] = calibrate(worker, submit, args, run_load)
        out["scales"] = scales
    wanted = spec.get("loads") or list(scales)
    for name, reqs in loads_for(args, {k: v for k, v in scales.items() if k in wanted}).items():
        slo = (spec.get("slos") or {}).get(name)
        if slo:
            _set_slo(worker, *slo)
        if mode == "unaware":  # a bound on harvest (its attainment is ~0): the sweep's window will do
            reqs = [r for r in reqs if r.send_at_s < args.sweep_s]
        out["loads"][name] = measure(worker, submit, run_load, reqs, span_of(reqs, args.sweep_s),
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
            "executor": _delta(_counters(m0), _counters(m1)), "admission_state": m1.get("slo"),
            "kv": {k: m1.get("kv", {}).get(k) for k in ("state", "budget_blocks", "total_blocks", "cuts")}
            | {"cuts_during": (m1.get("kv", {}).get("cuts") or 0) - (m0.get("kv", {}).get("cuts") or 0)}}


def calibrate(worker, submit, args, run_load) -> tuple[dict, dict]:
    """Rate per target busy fraction: busy measured at 2x the trace, each target's rate set from
    it (busy ~ rate), measured, and corrected once when more than RETRY_OFF off; the same for the
    chat load's targets from a chat measurement at 2x. Windows up to CALIBRATION_MAX_S: a busy
    fraction needs less than a P99 does. Returns (scales, what was tried)."""
    cal, scales = {"time_scale": BASE_SCALE, "tries": {}}, {}
    for kind, targets in (("trace", TARGETS), ("chat", CHAT_TARGETS)):
        first_reqs = _load(kind, args, (BASE_SCALE, 1.0), CALIBRATION_MAX_S)
        first = measure(worker, submit, run_load, first_reqs, span_of(first_reqs, args.sweep_s), False)
        frac = first["busy_fraction"]
        cal["busy_fraction" if kind == "trace" else "chat_busy_fraction"] = frac
        for x in targets:
            name, rate, tries = f"{kind} {int(100 * x)}%", x / max(frac, 1e-3), []
            for attempt in range(3):
                load = rate_to_load(rate)
                reqs = _load(kind, args, load, CALIBRATION_MAX_S)
                busy = measure(worker, submit, run_load, reqs, span_of(reqs, args.sweep_s), False)["busy_fraction"]
                tries.append({"rate": rate, "time_scale": load[0], "sample": load[1], "busy_fraction": busy,
                              "requests": len(reqs)})
                if abs(busy - x) <= RETRY_OFF * x or attempt == 2:
                    break
                rate *= correction(busy, x)
            scales[name] = rate_to_load(rate)
            cal["tries"][name] = tries
    load30 = scales["trace 30%"]
    scales["bursty"] = len(trace_load(args, load30[0], args.sweep_s, load30[1])) / args.sweep_s
    return scales, cal


def correction(busy: float, target: float) -> float:
    """Rate factor from a measured busy fraction to a target one, for busy = 1 - exp(-rate x S)
    (S: a request's service time), kept within [1/16, 4]."""
    busy = min(max(busy, 1e-3), 0.999)
    return min(4.0, max(1 / 16, math.log(1 - target) / math.log(1 - busy)))


async def drain(worker, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and worker.metrics(fresh=True).get("rollout", {}).get("in_flight", 0):
        await asyncio.sleep(0.05)


def report(runs: dict, slos: dict, args, console) -> dict:
    from rich.table import Table

    from replay.replayer import RequestRecord, summarize

    def recs(raw):
        return [RequestRecord(i, 0.0, 0.0, late, 0, n, n, ttft, tpot, ttft, ok)
                for i, (ttft, tpot, n, ok, late) in enumerate(raw)]

    ded = runs["dedicated"]["rollout"]["total_tokens_per_s"]
    alone = runs["serving_only"]["loads"]
    table = Table(title=f"Co-serving sweep: SLO = 2x serving-alone P99 per load; dedicated rollout "
                        f"{ded:.0f} tok/s (in+out); {args.sweep_s:g} s per load")
    cols = ("load", "busy", "req", "SLO TTFT/TPOT", "config", "TTFT P99", "TPOT P99", "attained",
            "rollout tok/s", "harvest", "harv. eff.", "turns started", "aborted", "returned",
            "steps admitted / denied (why)")
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
                   "executor": L["executor"], "kv": L.get("kv")}
            rows.append(row)
            ms = lambda v: "-" if v is None else f"{v * 1e3:.0f} ms"  # noqa: E731
            att = row["slo_attainment"]
            why = ", ".join(f"{v:,} {k.replace('_slack', '').replace('_headroom', '')}"
                            for k, v in sorted(ex.get("denied_by", {}).items(), key=lambda kv: -kv[1]))
            table.add_row(load, f"{busy:.0%}", str(s["requests"]), f"{slo[0] * 1e3:.0f}/{slo[1] * 1e3:.0f} ms", mode,
                          ms(row["ttft_p99_s"]), ms(row["tpot_p99_s"]),
                          "-" if att is None else (f"{att:.1%}" if att >= 0.99 else f"[red]{att:.1%}[/]"),
                          "-" if harvest is None else f"{row['rollout_tokens_per_s']:.0f}",
                          "-" if harvest is None else f"{harvest:.0%}",
                          "-" if eff is None else f"{eff:.2f}",
                          "-" if harvest is None else str(started),
                          "-" if harvest is None else str(row["turns_aborted"]),
                          "-" if harvest is None else str(row["turns_returned_unstarted"]),
                          "-" if mode != "rose" else f"{ex.get('admitted', 0):,} / {ex.get('denied', 0):,}"
                          + (f" ({why})" if why else ""))
    console.print(table)
    return {"rows": rows, "scales": runs["serving_only"].get("scales"),
            "calibration": runs["serving_only"].get("calibration"), "dedicated": runs["dedicated"]["rollout"]}


def slos_from(alone: dict, factor: float) -> dict:
    from replay.replayer import RequestRecord, summarize

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
    from bench.lib.results import write_json

    write_json(path, doc, default=json_default)
