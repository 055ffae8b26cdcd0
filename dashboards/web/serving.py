"""Serving page: per serving worker over the RL steps, TTFT and TPOT P99 against its SLO line,
SLO attainment, its load (requests, failed), the rollout turns it admitted and aborted, and its
rollout engine's park and wake (last wake's seconds, memory given back while parked); over
time, its KV blocks (serving vs rollout against the rollout budget, memory events marked) and
the rollout steps its admission denied (the `kv_timeline` view)."""
from __future__ import annotations

from dashboards.web.data import NAN, Columns, Frames, groups, scaled
from dashboards.web.plots import (Sources, color, grid, label, lines, pick, step_figure,
                                  time_figure, time_lines)

TITLE = "Serving"
# memory events (executors/coserving/kv_timeline.py): marker and color of each
EVENTS = {"burst": ("triangle", "#d62728"), "cut": ("inverted_triangle", "#9467bd"),
          "freeze": ("square", "#17becf"), "lease_reclaim": ("circle", "#8c564b"),
          "evict": ("x", "#e377c2"), "reload": ("cross", "#2ca02c")}
KV_LINES = (("serving_blocks", "serving", "solid"), ("rollout_blocks", "rollout", "solid"),
            ("budget_blocks", "rollout budget", "dashed"), ("total_blocks", "KV pool", "dotted"))


DENIED = {"rollout_denied_tpot": "TPOT slack", "rollout_denied_ttft": "TTFT slack",
          "rollout_denied_kv": "KV headroom", "rollout_denied_yielded": "yielded to a user",
          "rollout_yielded_to_users": "users yielded to"}


def data(frames: Frames) -> dict[tuple, Columns]:
    out = {}
    for (run, worker), c in groups(frames.serving, "run", "worker").items():
        out[("worker", run, worker)] = {
            "step": c["step"], "ttft_ms": scaled(c["ttft_p99_s"], 1e3),
            "tpot_ms": scaled(c["tpot_p99_s"], 1e3), "slo_ttft_ms": scaled(c["slo_ttft_s"], 1e3),
            "slo_tpot_ms": scaled(c["slo_tpot_s"], 1e3), "slo_attainment": c["slo_attainment"],
            "requests": c["requests"], "failed": c["failed"],
            "rollout_admitted": c["rollout_admitted"], "rollout_aborted": c["rollout_aborted"],
            **{k: c.get(k) or [None] * len(c["step"]) for k in DENIED},
            **park_columns(c)}
    for (run, worker), c in groups(frames.kv, "run", "worker").items():
        at = [t.timestamp() * 1e3 for t in c["sampled_at"]]  # Bokeh's datetime axis: epoch ms
        samples = [i for i, e in enumerate(c["event"]) if not isinstance(e, str)]
        cols = {k: [c[k][i] for i in samples] for k in ("step", "t_s", "serving_blocks",
                                                       "rollout_blocks", "budget_blocks",
                                                       "total_blocks", "admitted", "denied")}
        cols["at"] = [at[i] for i in samples]
        cols["denied_per_s"], cols["admitted_per_s"] = per_second(cols, "denied"), \
            per_second(cols, "admitted")
        out[("kv", run, worker)] = cols
        for i, event in enumerate(c["event"]):
            if isinstance(event, str):
                ev = out.setdefault(("kv_event", run, worker, event),
                                    {"at": [], "blocks": [], "step": [], "count": []})
                ev["at"].append(at[i])
                ev["blocks"].append(c["serving_blocks"][i])
                ev["step"].append(c["step"][i])
                ev["count"].append(c["event_count"][i])
    return out


def park_columns(c: Columns) -> Columns:
    """Park and wake (executors/coserving/parking.py): the last wake's seconds, and the MiB the
    last park gave back, shown only for steps whose report found the engine parked."""
    n = len(c["step"])
    wake, parked = c.get("wake_s") or [None] * n, c.get("parked") or [None] * n
    back = c.get("bytes_given_back") or [None] * n
    return {"wake_s": wake, "parked": parked,
            "given_back_mib": [b / 2**20 if p and b is not None else NAN for p, b in zip(parked, back)]}


def per_second(cols: Columns, name: str) -> list:
    """Counts per sample interval as a rate; NaN on a step's first sample (no interval)."""
    out = []
    for i, n in enumerate(cols[name]):
        same = i and cols["step"][i - 1] == cols["step"][i]
        dt = cols["t_s"][i] - cols["t_s"][i - 1] if same else 0
        out.append(n / dt if dt > 0 else NAN)
    return out


def kv_figure(run_worker: str, kv, events: dict[str, object]):
    # log scale: the budget is often 100x what either side uses (a sample of 0 leaves a gap)
    fig = time_figure(f"KV blocks, serving vs rollout: {run_worker} (markers: memory events)",
                      "KV blocks (peak per sample)", log=True)
    for i, (y, name, dash) in enumerate(KV_LINES):
        line = fig.line("at", y, source=kv, color=color(i), line_width=2, line_dash=dash,
                        legend_label=name)
        line.visible = y != "total_blocks"  # the whole pool flattens the rest: a click shows it
    for event, src in events.items():
        marker, hue = EVENTS.get(event, ("diamond", "#7f7f7f"))
        fig.scatter("at", "blocks", source=src, marker=marker, size=11, color=hue,
                    legend_label=event)
    return fig


def layout(sources: Sources):
    workers = pick(sources, "worker")
    runs = len({key[0] for key in workers} | {key[0] for key in pick(sources, "kv")})
    series = {label(key, runs): src for key, src in workers.items()}
    ttft = step_figure("TTFT P99 per step (dashed: the worker's SLO)", "ms")
    tpot = step_figure("TPOT P99 per step (dashed: the worker's SLO)", "ms")
    for fig, q in ((ttft, "ttft_ms"), (tpot, "tpot_ms")):
        lines(fig, series, q)
        lines(fig, series, f"slo_{q}", dash="dashed", suffix=" SLO")
    attain = step_figure("SLO attainment (TTFT and TPOT both met)", "requests", percent=True)
    lines(attain, series, "slo_attainment")
    load = step_figure("Serving requests per step (dashed: failed)", "requests")
    lines(load, series, "requests")
    lines(load, series, "failed", dash="dashed", suffix=" failed")
    turns = step_figure("Rollout turns admitted (solid) and aborted (dashed)", "turns")
    lines(turns, series, "rollout_admitted", suffix=" admitted")
    lines(turns, series, "rollout_aborted", dash="dashed", suffix=" aborted")
    denied = step_figure("Rollout steps denied per step, by reason (and users yielded to)", "steps")
    for i, (col, why) in enumerate(DENIED.items()):
        lines(denied, series, col, dash=("solid", "dashed", "dotted", "dotdash", "dashdot")[i],
              suffix=f" {why}")
    wake = step_figure("Rollout engine's last wake: rebuilt + the run's weights loaded", "s")
    lines(wake, series, "wake_s")
    back = step_figure("Memory given back to serving while the rollout engine is parked", "MiB")
    lines(back, series, "given_back_mib")
    figs = [ttft, tpot, attain, load, turns, denied, wake, back]
    kv = {label(key, runs): src for key, src in pick(sources, "kv").items()}
    if kv:
        events = pick(sources, "kv_event")
        for key, src in pick(sources, "kv").items():
            figs.append(kv_figure(label(key, runs), src, {k[-1]: s for k, s in events.items()
                                                          if k[:-1] == key}))
        admission = time_figure("Rollout admission per second: denied (solid), admitted "
                                "(dashed)", "rollout steps / s")
        time_lines(admission, kv, "denied_per_s", suffix=" denied")
        time_lines(admission, kv, "admitted_per_s", dash="dashed", suffix=" admitted")
        figs.append(admission)
    return grid(figs)
