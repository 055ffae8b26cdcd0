"""Train phase: one GRPO update on the trainer worker; checkpoint every K steps.

Not cached by Prefect: the trainer's state, not a stored result, says whether a step's update
happened. The trainer's version is the number of completed updates, so on a resumed step:
version == step - 1 -> train; version == step -> already trained (this worker, or the
checkpoint it reloaded), return the recorded metrics; anything else is an error, never a
silent double update.
"""
from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from executors.workers.trainer import local_trainer
from rose.config import RunConfig
from storage.atomic import write_atomic
from storage.checkpoints import checkpoint_steps
from storage.trajectories.dataset import TrajectoryStore


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
    does not recur: a retry of the same flow run (the UI's Retry button) then gets past it."""
    if cfg.fault_injection.get("train") != step:
        return
    marker = cfg.run_dir() / "faults" / f"train-{step}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    raise InjectedFault(f"fault injected into train at step {step}")


@task(name="train", retries=0, cache_policy=NO_CACHE)
def train(cfg: RunConfig, step: int) -> dict:
    inject_fault(cfg, step)
    trainer = local_trainer(cfg.run_id)
    if trainer.version == step:  # resumed after this step's update: do not apply it twice
        metrics = {**_recorded(cfg, step), "resumed": True}
        if checkpoint_due(cfg, step) and step not in checkpoint_steps(trainer.checkpoint_dir):
            metrics["checkpoint"] = str(trainer.save_checkpoint())
        return metrics
    if trainer.version != step - 1:
        raise RuntimeError(f"trainer holds version {trainer.version}, step {step} needs "
                           f"{step - 1}: resume from a checkpoint instead")
    turns = TrajectoryStore(cfg.trajectories_dir()).read_step(cfg.run_id, step)
    metrics = trainer.train_step(turns)
    if checkpoint_due(cfg, step):
        metrics["checkpoint"] = str(trainer.save_checkpoint())
    _record(cfg, step, metrics)
    return metrics
