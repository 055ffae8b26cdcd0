"""Runs page: reward and success per step with the runs overlaid, each run's phase times stacked
per step, tokens/s and the prefix-cache hit rate."""
from __future__ import annotations

from dashboards.web.data import Columns, Frames, groups
from dashboards.web.plots import Sources, grid, lines, pick, stacked, step_figure

TITLE = "Runs"
PHASES = ("rollout_s", "reward_s", "train_s", "publish_s")


def data(frames: Frames) -> dict[tuple, Columns]:
    return {("steps", run): cols for (run,), cols in groups(frames.steps, "run").items()}


def layout(sources: Sources):
    runs = {key[0]: src for key, src in pick(sources, "steps").items()}
    figs = []
    for title, y_label, y, percent in (
            ("Mean trajectory reward", "reward", "reward", False),
            ("Success rate", "episodes solved", "success_rate", True),
            ("Throughput (prompt + response tokens per second of step)", "tokens/s",
             "tokens_per_s", False),
            ("Prefix-cache hit rate", "prompt tokens cached", "prefix_cache_hit_rate", True)):
        fig = step_figure(title, y_label, percent)
        lines(fig, runs, y)
        figs.append(fig)
    for run, src in runs.items():
        fig = step_figure(f"Phase seconds per step: {run}", "seconds")
        stacked(fig, src, list(PHASES), [p[:-2] for p in PHASES])
        figs.append(fig)
    return grid(figs)
