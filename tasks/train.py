"""Train phase: one GRPO update on the trainer worker; checkpoint every K steps.

Not cached by Prefect: the trainer's state, not a stored result, says whether a step's update
happened. The trainer's version is the number of completed updates, so on a resumed step:
version == step - 1 -> train; version == step -> already trained (this worker, or the
checkpoint it reloaded), return the recorded metrics; anything else is an error, never a
silent double update.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from executors.workers.trainer import local_trainer
from core.config import RunConfig
from storage.atomic import write_atomic
from storage.checkpoints import checkpoint_steps
from storage.trajectories.dataset import TrajectoryStore
from tasks.publish import keep_snapshot
from tasks.trainer_group import on_ranks
from tasks.worker_threads import client_outside_thread_pool, leave_thread_pool


class InjectedFault(RuntimeError):
    """Raised on purpose by tests (RunConfig.fault_injection) to exercise resume."""


def metrics_path(cfg: RunConfig, step: int) -> Path:
    return cfg.run_dir() / "train" / f"step-{step:08d}.json"


def _record(cfg: RunConfig, step: int, metrics: dict) -> None:
    path = metrics_path(cfg, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(metrics, default=str))


def _recorded(cfg: RunConfig, step: int) -> dict:
    try:
        return json.loads(metrics_path(cfg, step).read_text())
    except (OSError, ValueError):
        return {"version": step}


def checkpoint_due(cfg: RunConfig, step: int) -> bool:
    return step % cfg.checkpoint_every == 0 or step == cfg.steps


def inject_fault(cfg: RunConfig, step: int) -> None:
    """fault_injection={"train": step} fails that step's train once per run, like a crash that
    does not recur: a retry of the same flow run (the UI's Retry button) then gets past it.
    {"train_overlapped": step} fails it the same way once the next step's rollout runs beside
    it (max_staleness = 1): the run stops between two overlapping phases."""
    for kind in ("train", "train_overlapped"):
        marker = cfg.run_dir() / "faults" / f"{kind}-{step}"
        if cfg.fault_injection.get(kind) != step or marker.exists():
            continue
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        where = ""
        if kind == "train_overlapped":
            where = (" beside the next step's rollout" if beside_rollout()
                     else " (no rollout came beside it)")
        raise InjectedFault(f"fault injected into train at step {step}{where}")


def beside_rollout(timeout_s: float = 120.0) -> bool:
    """Wait (up to timeout_s) until a rollout driver runs on this Dask worker beside the
    caller; True if one does. Its task counts once it has seceded (opened its worker client):
    the rollout function itself is running then, not only Prefect's start of its task run."""
    from distributed import get_worker

    state, deadline = get_worker().state, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:  # the worker's event loop changes this set: a read may meet a change, read again
            keys = [str(ts.key) for ts in state.long_running]
        except RuntimeError:
            continue
        if any(k.startswith("rollout-") for k in keys):  # Dask key: task name + token
            return True
        time.sleep(0.05)
    return False


@task(name="train", retries=0, cache_policy=NO_CACHE)
def train(cfg: RunConfig, step: int) -> dict:
    if cfg.max_staleness or cfg.coexec.group:
        # Leave the worker's task thread (the trainer worker has one): the next step's rollout
        # driver (this run's, or a group-mate's) and a publish start beside the update instead
        # of queueing behind it.
        leave_thread_pool()
    inject_fault(cfg, step)
    if cfg.train.backend == "megatron":  # every rank of the group trains; rank 0's metrics
        with client_outside_thread_pool() as client:
            return on_ranks(client, cfg, train_here, step)[0]
    return train_here(cfg, step)


def train_here(cfg: RunConfig, step: int) -> dict:
    """The step's update by this process's trainer (a megatron group's rank: every rank runs it)."""
    trainer = local_trainer(cfg.run_id)
    lead = trainer.layout_rank == (0, 0, 0)
    if trainer.version == step:  # resumed after this step's update: do not apply it twice
        metrics = {**_recorded(cfg, step), "resumed": True}
        keep_snapshot(cfg, trainer)
        if checkpoint_due(cfg, step) and step not in checkpoint_steps(trainer.checkpoint_dir):
            metrics["checkpoint"] = str(trainer.save_checkpoint())
        return metrics
    if trainer.version != step - 1:
        raise RuntimeError(f"trainer holds version {trainer.version}, step {step} needs "
                           f"{step - 1}: resume from a checkpoint instead")
    turns = TrajectoryStore(cfg.trajectories_dir()).read_step(cfg.run_id, step)
    metrics = trainer.train_step(turns)
    keep_snapshot(cfg, trainer)  # publish pushes these weights, even if the next update started
    if checkpoint_due(cfg, step):
        metrics["checkpoint"] = str(trainer.save_checkpoint())
    if lead:
        _record(cfg, step, metrics)
    return metrics
