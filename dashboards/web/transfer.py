"""Transfer page: per publish (one per RL step), the bytes the trainer shipped against the dense
bf16 weights, the mix of encodings chosen (storage/delta), the seconds of each stage (encode,
push into the relay, the slowest worker's pull, apply and engine load), the link rate each
publish chose its encodings by (publish.link_gbps, or measured: storage/weights/link_rate.py),
this host's coding speed against the time model's fitted costs (publish.measure_cpu:
storage/delta/host_speed.py), the coder processes each delta was coded in where a run has
them (publish.coder_processes: a fall to 0 is the trainer's threads coding instead), the
publish rate and version, the bytes each trainer rank pushed (a megatron group) and each engine
pulled, and how many versions each worker's turns lagged the trainer (from `turns`)."""
from __future__ import annotations

import json
import statistics

from dashboards.web.data import NAN, Columns, Frames, groups, scaled
from dashboards.web.plots import Sources, grid, label, lines, pick, stacked, step_figure

TITLE = "Transfer"
STAGES = ("encode_s", "push_s", "pull_s", "apply_s", "load_s")


def data(frames: Frames) -> dict[tuple, Columns]:
    out = {}
    for (run,), c in groups(frames.steps, "run").items():
        mb = scaled(c["publish_bytes"], 1e-6)
        out[("steps", run)] = {
            "step": c["step"], "publish_mb": mb, "sent_mb": mb, "publish_s": c["publish_s"],
            "mb_per_s": [m / s if s else NAN for m, s in zip(mb, c["publish_s"])],
            "policy_version": c["policy_version"]}
    for (run,), c in groups(frames.publishes, "run").items():
        out[("publishes", run)] = {"step": c["step"], "sent_mb": scaled(c["pushed_bytes"], 1e-6),
                                   "dense_mb": scaled(c["dense_bytes"], 1e-6),
                                   "link_gbps": c["link_gbps"], **{s: c[s] for s in STAGES},
                                   "coders": [NAN if n is None else n for n in c["coders"]],
                                   **_speeds(c["cpu_speed"])}
    for (run,), c in groups(frames.publishes, "run").items():
        for kind, column in (("rank_bytes", "rank_bytes"), ("pulled_bytes", "worker_pulled_bytes")):
            for who, series in _per_party(c["step"], c.get(column, [])).items():
                out[(kind, run, who)] = series
    for (run,), c in groups(frames.encodings, "run").items():
        steps = sorted(set(c["step"]))
        cols: Columns = {"step": steps}
        for step, encoding, sent in zip(c["step"], c["encoding"], c["encoded_bytes"]):
            cols.setdefault(encoding, [0.0] * len(steps))[steps.index(step)] = sent
        totals = [sum(v[i] for k, v in cols.items() if k != "step") for i in range(len(steps))]
        out[("encodings", run)] = {k: v if k == "step" else [x / t if t else NAN for x, t in
                                                           zip(v, totals)]
                                   for k, v in cols.items()}  # shares: a full publish dwarfs deltas
    for (run, worker), c in groups(frames.lag, "run", "worker").items():
        out[("lag", run, worker)] = {"step": c["step"], "mean_lag": c["mean_lag"],
                                     "max_lag": c["max_lag"]}
    return out


def _per_party(steps: list, records: list) -> dict[str, Columns]:
    """JSON {party: bytes} per publish (a trainer rank's pushes, an engine's pull) -> one MB
    series per party; a publish without the record (older runs, one trainer) is skipped."""
    out: dict[str, Columns] = {}
    for step, record in zip(steps, records):
        for party, nbytes in (json.loads(record) if isinstance(record, str) else {}).items():
            series = out.setdefault(party, {"step": [], "mb": []})
            series["step"].append(step)
            series["mb"].append(nbytes / 1e6)
    return out


def _speeds(records: list) -> Columns:
    """Per publish, from its cpu_speed JSON (method -> [encode, apply]): the median encode
    factor of the codings and raw's (its memory trip); NaN where not measured (a null: NaN)."""
    coding, raw = [], []
    for record in records:
        speed = json.loads(record) if isinstance(record, str) else {}
        codings = [enc for method, (enc, _) in speed.items() if method != "raw"]
        coding.append(statistics.median(codings) if codings else NAN)
        raw.append(speed.get("raw", [NAN])[0])
    return {"coding_x": coding, "raw_x": raw}


def layout(sources: Sources):
    runs = {key[0]: src for key, src in pick(sources, "steps").items()}
    publishes = {key[0]: src for key, src in pick(sources, "publishes").items()}
    # log scale: a delta is often 1000x smaller than the dense weights
    sent = step_figure("Bytes shipped per publish (dashed: the dense bf16 weights)", "MB",
                       log=True)
    # the publish records (version 0's publish too), else the step table's bytes
    lines(sent, {run: publishes.get(run, src) for run, src in runs.items()}, "sent_mb")
    lines(sent, publishes, "dense_mb", dash="dashed", suffix=" dense")
    figs = [sent]
    for (run,), src in pick(sources, "encodings").items():
        fig = step_figure(f"Encoding mix: share of the bytes sent per encoding, {run}", "bytes",
                          percent=True)
        encodings = sorted(c for c in src.data if c != "step")
        stacked(fig, src, encodings, encodings)
        figs.append(fig)
    for run, src in publishes.items():
        # encode_s is per tensor in the records: their sum is CPU seconds when coding is parallel
        fig = step_figure(f"Publish stages, s (encode: sum over tensors; pull, apply, load: "
                          f"slowest worker): {run}", "seconds")
        stacked(fig, src, list(STAGES), [s.removesuffix("_s") for s in STAGES])
        figs.append(fig)
    if publishes:  # a full snapshot chooses nothing: no point there
        link = step_figure("Link rate each delta was chosen by (publish.link_gbps, or measured)",
                           "Gbps")
        lines(link, publishes, "link_gbps")
        speed = step_figure("This host's speed against the time model's fitted costs: coding "
                            "(median of the codings' encode), raw (dashed)", "x fitted")
        lines(speed, publishes, "coding_x")
        lines(speed, publishes, "raw_x", dash="dashed", suffix=" raw")
        figs += [link, speed]
    coded = {run: src for run, src in publishes.items() if any(n > 0 for n in src.data["coders"])}
    if coded:  # runs with publish.coder_processes on: a fall to 0 is a fallback to threads
        coders = step_figure("Coder processes each delta was coded in (0: the trainer's threads, "
                             "e.g. where /dev/shm had no room)", "processes")
        lines(coders, coded, "coders")
        figs.append(coders)
    for kind, title in (("rank_bytes", "Bytes each trainer rank pushed (a megatron group: r<tp>.<pp>.<dp>)"),
                        ("pulled_bytes", "Bytes each engine pulled")):
        parties = pick(sources, kind)
        if parties:
            fig = step_figure(title, "MB")
            lines(fig, {label(key, len(runs)): src for key, src in parties.items()}, "mb")
            figs.append(fig)
    total = step_figure("Publish seconds (encode, relay, pull, reload)", "seconds")
    lines(total, runs, "publish_s")
    rate = step_figure("Publish rate", "MB/s")
    lines(rate, runs, "mb_per_s")
    lag = pick(sources, "lag")
    series = {label(key, len(runs)): src for key, src in lag.items()}
    lagged = step_figure("Policy version lag of each worker's turns: mean (solid), max (dashed)",
                         "versions behind")
    lines(lagged, series, "mean_lag")
    lines(lagged, series, "max_lag", dash="dashed", suffix=" max")
    version = step_figure("Policy version after the step's publish", "version")
    lines(version, runs, "policy_version")
    return grid(figs + [total, rate, lagged, version])
