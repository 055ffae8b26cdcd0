"""The `paper-figures` deployment: the paper's figures (sim/paper_figures.py) on Dask workers, one
simulation a Prefect task, so the paper's figures (some 70 simulations, the 1,024-GPU one among
them) fan out past one machine on the same engine as the RL steps and the cluster-sim sweep.

sim/paper_figures.py's write_figures runs in the flow: each batch of simulations that do not
depend on each other (the configurations judged at the SLO a fixed run sets wait for it) is
submitted at once, and the rows, the printed report, the JSON and the PNGs are what
`python -m bench.sim.paper_figures` with the same arguments gives (sim/timed_run.py runs each
simulation either way). The PNGs are drawn by bench/sim/paper_figures_plot.py in a process of its
own, as the `benchmarks` deployment runs bench scripts (matplotlib is a dev dependency).

    .venv/bin/python -m flows.paper_figures --figures fig1 fig7a dapo 32b
    .venv/bin/python -m flows.paper_figures --only-32b
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Literal, get_args

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect_dask import DaskTaskRunner
from pydantic import BaseModel, ConfigDict, Field

import sim.paper_figures as figures
from flows.cluster_sim import stack_scheduler
from coordination.dask_security import DaskScheduler
from sim.config import SimConfig
from sim.paper_report import report, report_32b
from sim.timed_run import simulate
from sim.workload import WorkloadSpec
from storage.atomic import write_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS_JSON = ROOT / "bench" / "results" / "paper_figures.json"  # where `python -m bench.sim.paper_figures` writes
Figure = Literal["fig1", "fig7a", "dapo", "sensitivity", "scale", "32b"]  # sim/paper_figures.py's FIGURES


class PaperFiguresRequest(BaseModel):
    """sim/paper_figures.py's options (`python -m bench.sim.paper_figures --help`), and where the
    Dask workers are."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(3, ge=1)
    seed: int = 0
    fleet: str = "h100_qwen3_8b"
    workload: str | None = None  # None: the paper's Qwen3-8B FrozenLake workload
    # fig7a: with Table 3, Fig. 14 and the concurrency table; scale (the 1,024-GPU timing run) needs fig7a
    figures: list[Figure] = Field(default_factory=lambda: list(get_args(Figure)), min_length=1)
    scale_gpus: int = Field(1024, ge=2)
    only_32b: bool = False  # the 32B rows alone, into the existing JSON
    out: str | None = None  # the JSON's path (None: bench/results/paper_figures.json); PNGs beside it
    dask_scheduler: str | None = None  # None: the local stack's, else a local Dask cluster

    def argv(self) -> list[str]:
        out = ["--steps", str(self.steps), "--seed", str(self.seed), "--fleet", self.fleet,
               "--scale-gpus", str(self.scale_gpus)]
        out += ["--workload", self.workload] if self.workload else []
        out += ["--out", self.out] if self.out else []
        return out + ["--figures", *self.figures] + ["--only-32b"] * self.only_32b


@task(name="simulate", retries=1, cache_policy=NO_CACHE)
def simulate_one(cfg: dict, spec: WorkloadSpec | None, own_slo: bool) -> dict:
    """One simulation of SimConfig(**cfg), as the bench runs it (sim/timed_run.py)."""
    return simulate(SimConfig(**cfg), spec, own_slo)


def _on_dask(jobs: dict) -> dict[str, dict]:
    """A batch of the figures' jobs, one task each, all submitted before any is awaited."""
    futures = {name: simulate_one.with_options(task_run_name=j.label or j.cfg.config).submit(
        asdict(j.cfg), j.spec, j.own_slo) for name, j in jobs.items()}
    return {name: f.result() for name, f in futures.items()}


def write_json(out: Path, doc: dict) -> None:
    """`doc` into `out` atomically, as the bench writes its JSON (indent 1)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


def plot(out: Path) -> None:
    """The figures' PNGs beside `out`, by bench/sim/paper_figures_plot.py from the JSON there."""
    done = subprocess.run([sys.executable, "-m", "bench.sim.paper_figures_plot", str(out)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    print(done.stdout.strip())


@flow(name="paper-figures-runs")
def figures_on_dask(argv: list[str]) -> dict:
    args = figures.parser(RESULTS_JSON).parse_args(argv)
    with figures.runner(_on_dask):
        fields = figures.write_figures(args, write_json)
    if fields["fig7a"] and not args.only_32b:  # the plots draw Fig. 7a's runs
        plot(args.out)
    return fields


@flow(name="paper-figures", log_prints=True)
def paper_figures(request: PaperFiguresRequest = PaperFiguresRequest()) -> dict:
    """The paper's figures simulated on the stack's Dask workers (or a local Dask cluster); the
    report as a markdown artifact, the JSON and PNGs where the bench writes them."""
    from prefect.artifacts import create_markdown_artifact

    scheduler = DaskScheduler(request.dask_scheduler) if request.dask_scheduler else stack_scheduler()
    runner = scheduler.task_runner() if scheduler else DaskTaskRunner()  # None: a local cluster
    fields = figures_on_dask.with_options(task_runner=runner)(request.argv())
    text = "\n".join(report_32b({"qwen3_32b": fields})) if request.only_32b else report(fields)
    create_markdown_artifact(text, key="paper-figures", description="sim/paper_figures.py on Dask")
    return fields


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--figures", nargs="+", choices=get_args(Figure), default=list(get_args(Figure)))
    ap.add_argument("--only-32b", action="store_true")
    a = ap.parse_args()
    paper_figures(PaperFiguresRequest(steps=a.steps, figures=a.figures, only_32b=a.only_32b))
