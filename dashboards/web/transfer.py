"""Transfer page: per publish (one per RL step), the bytes the trainer shipped, the publish time
(encode, relay, every rollout worker's pull and reload) and the policy version it produced."""
from __future__ import annotations

from dashboards.web.data import NAN, Columns, Frames, groups, scaled
from dashboards.web.plots import Sources, grid, lines, pick, step_figure

TITLE = "Transfer"


def data(frames: Frames) -> dict[tuple, Columns]:
    out = {}
    for (run,), c in groups(frames.steps, "run").items():
        mb = scaled(c["publish_bytes"], 1e-6)
        out[("steps", run)] = {
            "step": c["step"], "publish_mb": mb, "publish_s": c["publish_s"],
            "mb_per_s": [m / s if s else NAN for m, s in zip(mb, c["publish_s"])],
            "policy_version": c["policy_version"]}
    return out


def layout(sources: Sources):
    runs = {key[0]: src for key, src in pick(sources, "steps").items()}
    figs = []
    for title, y_label, y in (("Bytes shipped per publish", "MB", "publish_mb"),
                              ("Publish seconds (encode, relay, pull, reload)", "seconds",
                               "publish_s"),
                              ("Publish rate", "MB/s", "mb_per_s"),
                              ("Policy version after the step's publish", "version",
                               "policy_version")):
        fig = step_figure(title, y_label)
        lines(fig, runs, y)
        figs.append(fig)
    return grid(figs)
