"""Serving page: per serving worker over the RL steps, TTFT and TPOT P99 against its SLO line,
SLO attainment, its load (requests, failed) and the rollout turns it admitted and aborted."""
from __future__ import annotations

from dashboards.web.data import Columns, Frames, groups, scaled
from dashboards.web.plots import Sources, grid, label, lines, pick, step_figure

TITLE = "Serving"


def data(frames: Frames) -> dict[tuple, Columns]:
    out = {}
    for (run, worker), c in groups(frames.serving, "run", "worker").items():
        out[("worker", run, worker)] = {
            "step": c["step"], "ttft_ms": scaled(c["ttft_p99_s"], 1e3),
            "tpot_ms": scaled(c["tpot_p99_s"], 1e3), "slo_ttft_ms": scaled(c["slo_ttft_s"], 1e3),
            "slo_tpot_ms": scaled(c["slo_tpot_s"], 1e3), "slo_attainment": c["slo_attainment"],
            "requests": c["requests"], "failed": c["failed"],
            "rollout_admitted": c["rollout_admitted"], "rollout_aborted": c["rollout_aborted"]}
    return out


def layout(sources: Sources):
    workers = pick(sources, "worker")
    runs = len({key[0] for key in workers})
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
    return grid([ttft, tpot, attain, load, turns])
