"""The training run: N RL steps, each its own `rl_step` flow run, from the last checkpoint on.

    python -m flows.train --steps 5        (or `rose train`, which also starts the stack)

Deployed (prefect.yaml, `rose deploy`) as `train/train` and `rl-step/rl-step`; both take a
RunConfig, so the Prefect UI renders its fields as a form with defaults and validation.
Started again on a run that stopped (a failure, `rose down`), `train` continues after the
trainer's version: the trainer reloads its last checkpoint, the relay gets that version again,
and completed phases of an interrupted step come back from Prefect's result store.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from distributed import Client
from prefect import flow

from dashboards.artifacts import publish_run_artifact
from dashboards.events import emit
from flows.coexec import membership
from executors.workers.rollout_worker import RolloutWorkerPlugin
from executors.workers.trainer import TrainerPlugin, trainer_version
from flows.pipeline import run_pipelined
from flows.rl_step import rl_step
from core.config import RunConfig
from coordination.dask_security import DaskScheduler
from coordination.run_lease import RunLease, driving
from executors.coserving.registration import start_serving
from coordination.serving_leases import borrowing
from storage.atomic import write_atomic
from tasks.borrow import stack_leases
from tasks.publish import publish_and_sync
from tasks.trainer_group import on_ranks

ON_TRAINER = {"resources": {"train_gpu": 1}}
RUN_CONFIG_FILE = "config.json"


def dask_scheduler(cfg: RunConfig) -> DaskScheduler:
    """The configured scheduler (with stack.dask_tls), else the local stack's (started by
    `rose up`, with the TLS files it recorded)."""
    if cfg.stack.dask_scheduler:
        return DaskScheduler(cfg.stack.dask_scheduler, cfg.stack.dask_tls)
    from core.config import stack_dir
    from coordination.stack_record import load_stack

    handle = load_stack(stack_dir())
    if handle is not None:
        return handle.scheduler()
    if os.environ.get("ROSE_DASK_SCHEDULER"):  # set for deployment workers (`rose deploy`)
        return DaskScheduler(os.environ["ROSE_DASK_SCHEDULER"])
    raise RuntimeError(f"no Dask scheduler: no running local stack in {stack_dir()} (start "
                       "one with `rose up`) and stack.dask_scheduler is not set")


def attach_executors(client: Client, cfg: RunConfig) -> int:
    """Register the long-lived executors (idempotent) and return the trainer's policy version."""
    from tasks.placement import check_hw_affinity, require, workers_by_kind

    kinds = workers_by_kind(client)
    trainers, _ = require(kinds, "trainer"), require(kinds, "rollout")
    check_hw_affinity(client, cfg.rollout.hw_affinity)  # refused before any step, not at its rollout
    if cfg.train.backend == "hf" and len(trainers) > 1:
        raise ValueError(f"train.backend hf trains in one process, the stack has {len(trainers)} trainer "
                         "workers: use train.backend megatron with train.parallel, or `rose up --trainers 1`")
    client.register_plugin(RolloutWorkerPlugin(cfg.models.policy_path()), name="rose-rollout")
    start_serving(client, cfg.models, cfg.stack)  # serving workers: already up unless on a new cluster
    trainer = TrainerPlugin(cfg)
    client.register_plugin(trainer, name=trainer.name)
    if cfg.train.backend == "megatron":  # the group forms (or re-forms) here, before any step
        return on_ranks(client, cfg, trainer_version)[0]
    return client.submit(trainer_version, cfg, pure=False, **ON_TRAINER).result()


def detach_serving(scheduler: DaskScheduler, run: str) -> None:
    """The run is over: the serving workers it holds stop lending their rollout side (serving
    goes on; those another run holds go on lending to it)."""
    from executors.coserving.plugin import detach_coserving
    from executors.coserving.registration import serving_workers

    held = set(stack_leases().held_by(run))
    with scheduler.client() as client:
        names = [n for n in serving_workers(client) if n in held]
        if names:
            client.run(detach_coserving, workers=[client_address(client, n) for n in names])


def trainer_name(scheduler: DaskScheduler) -> str:
    from tasks.placement import require, workers_by_kind

    with scheduler.client() as client:
        return require(workers_by_kind(client), "trainer")[0]


def client_address(client: Client, name: str) -> str:
    return next(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                if str(w["name"]) == name)


def save_run_config(cfg: RunConfig) -> Path:
    """<run dir>/config.json: what `rose resume <run>` starts again from."""
    path = cfg.run_dir() / RUN_CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, cfg.model_dump_json(indent=1))
    return path


def prepare(cfg: RunConfig) -> tuple[DaskScheduler, int]:
    """Connect, attach executors, re-publish the trainer's version; (scheduler, version)."""
    scheduler = dask_scheduler(cfg)
    with scheduler.client() as client:
        version = attach_executors(client, cfg)
        # The relay may have lost its objects (restart): publish what the trainer holds now.
        client.submit(publish_and_sync, cfg, version, pure=False, **ON_TRAINER).result()
    return scheduler, version


def pin_step_identity(first_step: int) -> None:
    """Make the rl_step call for step s the (s-1)-th rl_step call of this flow run.

    Prefect identifies a subflow call by its order in the parent run. A retried train run
    starts after the trainer's version, so without this its first call (step 2, say) would be
    matched to the original run's first call (step 1): that completed run would be renamed and
    re-used for step 2. Pinned, the retry's step-2 call meets the failed step-2 call and gets a
    fresh subflow run. (Uses Prefect's per-run call counter, FlowRunContext.task_run_dynamic_keys.)
    """
    from prefect import Task
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or first_step <= 1 or not hasattr(ctx, "task_run_dynamic_keys"):
        return
    key = Task(name=rl_step.name, fn=rl_step.fn, version=rl_step.version).task_key
    ctx.task_run_dynamic_keys[key] = first_step - 2  # the next call takes first_step - 1


@flow(name="train", flow_run_name="{cfg.run_id}", log_prints=True)
def train(cfg: RunConfig = RunConfig()) -> list[dict]:
    """Run steps (last completed + 1) .. cfg.steps; each step is an `rl_step` flow run.

    One driver per run: the run lease is taken first (a second driver is refused, naming the
    first, before it touches the saved config or the stack) and held until the flow returns."""
    with driving(cfg.run_dir(), cfg.run_id) as lease:
        return _train(cfg, lease)


def _train(cfg: RunConfig, lease: RunLease) -> list[dict]:
    save_run_config(cfg)
    scheduler, version = prepare(cfg)
    emit("run_start", run=cfg.run_id, start_version=version, steps=cfg.steps)
    print(f"run {cfg.run_id}: trainer at policy version {version}, "
          f"steps {version + 1}..{cfg.steps} to go")
    step_flow = rl_step.with_options(task_runner=scheduler.task_runner())
    pin_step_identity(version + 1)
    # the serving workers each step borrows stay leased to this run while it drives (renewed),
    # and are given back when it ends (tasks/borrow.py)
    # `--group`: admitted to a co-execution group (or one of its own, said), its phases in turns
    with borrowing(stack_leases(), cfg.run_id, cfg.borrow.lease_ttl_s), \
            membership(cfg, trainer_name(scheduler) if cfg.coexec.group else ""):
        try:
            if cfg.max_staleness:  # one step of rollout ahead of training (flows/pipeline.py)
                summaries = run_pipelined(step_flow, cfg, version + 1, trainer_name(scheduler))
            else:
                summaries = []
                for step in range(version + 1, cfg.steps + 1):
                    lease.check()  # taken over (our renewals stalled): stop before the next step
                    summaries.append(step_flow(cfg, step))
        finally:
            detach_serving(scheduler, cfg.run_id)
    publish_run_artifact(cfg.run_id, summaries)
    emit("run_end", run=cfg.run_id, summaries=summaries)
    return summaries


@flow(name="rl-step", flow_run_name="{cfg.run_id}-rerun-step", log_prints=True)
def run_step(cfg: RunConfig = RunConfig(), step: int | None = None) -> dict:
    """Run (or resume) one RL step on the stack; default: the step after the trainer's version.

    Only that step or the trainer's own version (a step whose publish did not finish) can run:
    any other would train on trajectories of a policy the trainer no longer holds.
    """
    with driving(cfg.run_dir(), cfg.run_id):
        return _run_step(cfg, step)


def _run_step(cfg: RunConfig, step: int | None) -> dict:
    scheduler, version = prepare(cfg)
    step = version + 1 if step is None else step
    if step not in (version, version + 1) or step < 1:
        raise ValueError(f"step {step} cannot run: the trainer of run {cfg.run_id} holds "
                         f"version {version}, so the next step is {version + 1}")
    save_run_config(cfg)
    with borrowing(stack_leases(), cfg.run_id, cfg.borrow.lease_ttl_s):
        return rl_step.with_options(task_runner=scheduler.task_runner())(cfg, step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--run-id", default="demo")
    args = parser.parse_args()
    train(RunConfig(run_id=args.run_id, steps=args.steps))


if __name__ == "__main__":
    main()
