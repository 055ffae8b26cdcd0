"""Time per phase of one RL step, and the Prefect + Dask overhead as a share of the step.

    python -m bench.stack.step [--steps 3] [--groups 8] [--group-size 8]

Runs real steps on the local stack (started if needed). For each phase, the wall time seen
by the flow (submit -> result, through Prefect's task machinery and Dask) is compared with
the time the work itself took inside the worker (engine rollout, trainer update); the rest
is orchestration overhead. Prints a table and writes bench/results/step.json.
"""
from __future__ import annotations

import argparse
import statistics


from rich.console import Console
from rich.table import Table

from core.config import RolloutConfig, RunConfig
from rose.launch import default_run_id, ensure_models, ensure_stack

from bench.lib.results import RESULTS, write_json


def phase_rows(summaries: list[dict]) -> list[dict]:
    """Per step: phase wall times as the flow saw them vs the work measured in the workers."""
    rows = []
    for s in summaries:
        inner = s["engine_rollout_s"] + s["engine_train_s"]
        phases = s["rollout_s"] + s["reward_s"] + s["train_s"] + s["publish_s"]
        # reward and publish are tiny amounts of work: count them wholly as phase time, and
        # the overhead as what rollout/train lost between the flow and the worker.
        overhead = (s["rollout_s"] - s["engine_rollout_s"]) + (s["train_s"] - s["engine_train_s"])
        rows.append({"step": s["step"], "rollout_s": s["rollout_s"], "reward_s": s["reward_s"],
                     "train_s": s["train_s"], "publish_s": s["publish_s"],
                     "step_s": s["step_s"], "work_s": inner,
                     "orchestration_s": overhead + (s["step_s"] - phases),
                     "tokens_per_s": s["tokens_per_s"]})
    for r in rows:
        r["overhead_share"] = r["orchestration_s"] / r["step_s"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    console = Console(width=140)
    cfg = RunConfig(run_id=default_run_id("bench-step"), steps=args.steps,
                    rollout=RolloutConfig(groups=args.groups, group_size=args.group_size))
    ensure_models(cfg, console)
    ensure_stack(cfg, console)
    from flows.train import train

    rows = phase_rows(train(cfg))
    table = Table(title="One RL step: phase times (s) and orchestration overhead",
                  header_style="bold cyan")
    cols = ["step", "rollout_s", "reward_s", "train_s", "publish_s", "step_s", "work_s",
            "orchestration_s", "overhead_share", "tokens_per_s"]
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*[f"{r[c]:.0%}" if c == "overhead_share" else
                        (str(r[c]) if c == "step" else f"{r[c]:.2f}") for c in cols])
    steady = rows[1:] or rows  # step 1 pays engine warm-up
    med = {c: statistics.median(r[c] for r in steady) for c in cols[1:]}
    table.add_row("median*", *[f"{med[c]:.0%}" if c == "overhead_share" else f"{med[c]:.2f}"
                               for c in cols[1:]])
    console.print(table)
    console.print("* median over steps after the first (the first pays engine warm-up)")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "step.json"
    write_json(out, {"config": cfg.model_dump(mode="json"), "steps": rows, "median_after_first": med})


if __name__ == "__main__":
    main()
