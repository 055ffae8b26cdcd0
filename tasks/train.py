"""Train phase: one GRPO update on the trainer worker; checkpoint every K steps."""
from __future__ import annotations

from prefect import task

from executors.trainer import local_trainer
from rose.config import RunConfig
from storage.trajectories import TrajectoryStore


class InjectedFault(RuntimeError):
    """Raised on purpose by tests (RunConfig.fault_injection) to exercise resume."""


@task(name="train", retries=0)
def train(cfg: RunConfig, step: int) -> dict:
    if cfg.fault_injection.get("train") == step:
        raise InjectedFault(f"fault injected into train at step {step}")
    trainer = local_trainer(cfg.run_id)
    if trainer.version != step - 1:
        raise RuntimeError(f"trainer holds version {trainer.version}, step {step} needs "
                           f"{step - 1}: resume from a checkpoint instead")
    turns = TrajectoryStore(cfg.trajectories_dir()).read_step(cfg.run_id, step)
    metrics = trainer.train_step(turns)
    if step % cfg.checkpoint_every == 0 or step == cfg.steps:
        metrics["checkpoint"] = str(trainer.save_checkpoint())
    return metrics
