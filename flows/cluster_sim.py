"""The `cluster-sim` deployment: a sweep of cluster simulations (sim/), one simulation a task,
fanned out on Dask workers, so a large sweep scales past one machine on the same engine as the
RL steps.

Per scale, the `fixed` configuration runs first and sets the SLO (2x its P99 TTFT/TPOT, as
bench/sim/cluster_sim.py does); then every other configuration x pipeline mode runs at that SLO,
all scales at once. The rows come back as a table artifact and the flow's result.

    .venv/bin/python -m flows.cluster_sim --scales 16 64 --configs rose static
    # the paper's Fig. 7a configurations (bench/sim/paper_figures.py runs them on one machine)
    .venv/bin/python -m flows.cluster_sim --scales 16 --configs rose elastic --fleet h100_qwen3_8b \
        --workload workload_paper_qwen3_8b_frozenlake --serving-ratio 2
"""
from __future__ import annotations

import argparse
from dataclasses import asdict

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect_dask import DaskTaskRunner
from pydantic import BaseModel, ConfigDict, Field, field_validator

from coordination.dask_security import DaskScheduler
from sim.cluster import ClusterSim
from sim.config import CONFIGS, SimConfig
from sim.fleet import load_fleet, sweep_settings
from sim.profiles import PROFILE_DIR
from sim.report import rate_text, speedup


class SimSweep(BaseModel):
    """Which simulations to run: scales (GPUs of the RL job) x configurations x pipeline modes."""

    model_config = ConfigDict(extra="forbid")
    scales: list[int] = Field(default_factory=lambda: [16, 64], min_length=1)
    configs: list[str] = Field(default_factory=lambda: ["rose", "slo_unaware", "static"])
    off_policy: list[int] = Field(default_factory=lambda: [0])  # SimConfig.off_policy values
    steps: int = Field(3, ge=1)
    rate: float | None = Field(None, gt=0)  # trace speed-up per serving GPU (None: 6, or the fleet's)
    fleet: str | None = None  # sim/profiles/fleet_<name>.json: a GPU fleet (sim/fleet.py)
    serving_ratio: float = Field(1.0, ge=0)
    # sim/profiles/<name>.json, e.g. workload_paper_qwen3_8b_frozenlake (sim/paper_workloads.py)
    workload: str = "workload_frozenlake"
    traj_per_rollout_gpu: int = Field(32, ge=1)
    seed: int = 0
    dask_scheduler: str | None = None  # None: the local stack's, else a local Dask cluster

    @field_validator("configs")
    @classmethod
    def _known(cls, configs: list[str]) -> list[str]:
        unknown = [c for c in configs if c not in CONFIGS]
        if unknown:
            raise ValueError(f"unknown configurations {unknown} (have: {', '.join(CONFIGS)})")
        return configs

    @field_validator("fleet")
    @classmethod
    def _fleet_exists(cls, fleet: str | None) -> str | None:
        if fleet is not None:
            try:
                load_fleet(fleet)
            except FileNotFoundError as e:  # its message names the shipped fleets
                raise ValueError(str(e)) from None
        return fleet

    @field_validator("workload")
    @classmethod
    def _workload_exists(cls, workload: str) -> str:
        if not (PROFILE_DIR / f"{workload}.json").is_file():
            known = sorted(p.stem for p in PROFILE_DIR.glob("workload_*.json"))
            raise ValueError(f"no workload {workload!r} in {PROFILE_DIR}; shipped: {known}")
        return workload

    def base(self, gpus: int) -> SimConfig:
        return SimConfig(gpus=gpus, steps=self.steps, seed=self.seed, serving_ratio=self.serving_ratio,
                         workload=self.workload, traj_per_rollout_gpu=self.traj_per_rollout_gpu,
                         **sweep_settings(self.fleet, self.rate))


@task(name="simulate", retries=1, cache_policy=NO_CACHE)
def simulate(cfg: dict) -> dict:
    """One simulation of SimConfig(**cfg); its summary without the per-step rows."""
    result = ClusterSim(SimConfig(**cfg)).run()
    return {k: v for k, v in result.items() if k != "per_step"}


@flow(name="cluster-sim-sweep")
def sweep_on_dask(sweep: SimSweep) -> list[dict]:
    fixed = {g: simulate.submit(asdict(sweep.base(g)) | {"config": "fixed"}) for g in sweep.scales}
    runs = []
    for gpus, future in fixed.items():
        f = future.result()
        # no serving request finished (a tiny, short run): the serving profile's own SLO rule
        slo = ({"slo_ttft_s": 2 * f["ttft_p99_s"], "slo_tpot_s": 2 * f["tpot_p99_s"]}
               if f["ttft_p99_s"] is not None and f["tpot_p99_s"] is not None else {})
        runs += [simulate.submit(asdict(sweep.base(gpus)) | slo | {"config": c, "off_policy": k})
                 for c in ["fixed", *sweep.configs] for k in sweep.off_policy]
    rows = [r.result() for r in runs]
    by_scale = {r["gpus"]: r for r in rows if r["config"] == "fixed" and not r["off_policy"]}
    for r in rows:
        r["speedup_vs_fixed"] = speedup(r, by_scale[r["gpus"]])
    return rows


@flow(name="cluster-sim", log_prints=True)
def cluster_sim(sweep: SimSweep = SimSweep()) -> list[dict]:
    """Run the sweep on the stack's Dask workers (or a local Dask cluster); a table artifact."""
    from prefect.artifacts import create_table_artifact

    scheduler = DaskScheduler(sweep.dask_scheduler) if sweep.dask_scheduler else stack_scheduler()
    runner = scheduler.task_runner() if scheduler else DaskTaskRunner()  # None: a local cluster
    rows = sweep_on_dask.with_options(task_runner=runner)(sweep)
    keys = ("gpus", "serving_gpus", "config", "off_policy", "tokens_per_s", "speedup_vs_fixed",
            "slo_attainment", "borrowed_share", "affinity_hit_rate", "wall_s")
    create_table_artifact([{k: r.get(k) for k in keys} for r in rows], key="cluster-sim",
                          description="cluster simulation sweep (sim/)")
    for r in rows:
        gain = "-" if r["speedup_vs_fixed"] is None else f"{r['speedup_vs_fixed']:.2f}x"
        print(f"{r['gpus']:>5} GPUs {r['config']:>11} off-policy {r['off_policy']}: "
              f"{rate_text(r):>12} tok/s ({gain} fixed)")
    return rows


def stack_scheduler() -> DaskScheduler | None:
    """The local stack's scheduler (TLS to a cluster's as recorded) when one runs, else None."""
    from core.config import stack_dir
    from coordination.stack_record import load_stack

    handle = load_stack(stack_dir())
    return handle.scheduler() if handle is not None else None


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--configs", nargs="+", default=["rose", "slo_unaware", "static"])
    ap.add_argument("--off-policy", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fleet", default=None, help="sim/profiles/fleet_<name>.json, e.g. h100_qwen3_8b")
    ap.add_argument("--workload", default="workload_frozenlake", help="sim/profiles/<name>.json")
    ap.add_argument("--serving-ratio", type=float, default=1.0, help="borrowed serving GPUs per rollout GPU")
    a = ap.parse_args()
    cluster_sim(SimSweep(scales=a.scales, configs=a.configs, off_policy=a.off_policy, steps=a.steps,
                         fleet=a.fleet, workload=a.workload, serving_ratio=a.serving_ratio))
