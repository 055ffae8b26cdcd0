"""Routing page: turns per worker per step (rollout and borrowed serving workers), the borrowed
share of rollout tokens, the affinity hit rate (a trajectory's turn on the worker of its previous
turn, where its prefix is cached), rerouted turns, and how long turns queued per worker kind."""
from __future__ import annotations

from dashboards.web.data import Columns, Frames, groups, scaled
from dashboards.web.plots import Sources, grid, label, lines, pick, stacked, step_figure

TITLE = "Routing"


def data(frames: Frames) -> dict[tuple, Columns]:
    out: dict[tuple, Columns] = {}
    for (run,), c in groups(frames.steps, "run").items():
        out[("steps", run)] = {"step": c["step"], "borrowed_share": c["borrowed_share"],
                               "rerouted_turns": c["rerouted_turns"]}
    for (run,), c in groups(frames.workers, "run").items():
        steps = sorted(set(c["step"]))
        cols: Columns = {"step": steps}
        for step, worker, kind, turns in zip(c["step"], c["worker"], c["worker_kind"], c["turns"]):
            cols.setdefault(f"{worker} ({kind})", [0] * len(steps))[steps.index(step)] = turns
        out[("turns", run)] = cols
    for (run,), c in groups(frames.affinity, "run").items():
        out[("affinity", run)] = {"step": c["step"], "hit_rate": c["hit_rate"],
                                  "later_turns": c["later_turns"]}
    for (run, kind), c in groups(frames.queued, "run", "worker_kind").items():
        out[("queued", run, kind)] = {"step": c["step"], "mean_ms": scaled(c["mean_s"], 1e3),
                                      "p99_ms": scaled(c["p99_s"], 1e3)}
    return out


def layout(sources: Sources):
    steps = {key[0]: src for key, src in pick(sources, "steps").items()}
    figs = []
    for (run,), src in pick(sources, "turns").items():
        fig = step_figure(f"Turns per worker per step: {run}", "turns")
        workers = sorted(c for c in src.data if c != "step")
        stacked(fig, src, workers, workers)
        figs.append(fig)
    share = step_figure("Borrowed share: rollout tokens generated on serving workers",
                        "tokens", percent=True)
    lines(share, steps, "borrowed_share")
    affinity = step_figure("Affinity hit rate: turns on their previous turn's worker",
                           "turns after a trajectory's first", percent=True)
    lines(affinity, {key[0]: src for key, src in pick(sources, "affinity").items()}, "hit_rate")
    rerouted = step_figure("Rerouted turns (lost on a worker, re-prefilled on another)", "turns")
    lines(rerouted, steps, "rerouted_turns")
    queued = pick(sources, "queued")
    series = {label(key, len(steps)): src for key, src in queued.items()}
    wait = step_figure("Time a turn queued, per worker kind: mean (solid), P99 (dashed)", "ms")
    lines(wait, series, "mean_ms", suffix=" mean")
    lines(wait, series, "p99_ms", dash="dashed", suffix=" P99")
    return grid(figs + [share, affinity, rerouted, wait])
