"""`rose resume <run>`: start a stopped or failed run again where it stopped.

The train flow saved the run's config in <data>/runs/<run>/config.json. Resuming runs the train
flow again with it (fault injection cleared, optionally more steps): the trainer is at the
version of its last completed update (in memory, or reloaded from its last checkpoint after a
restart), the relay gets that version again, and the interrupted step's completed phases come
back from Prefect's result store as `Cached`, so no rollout is redone and no row duplicated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from core.config import RunConfig, data_dir
from rose.config_file import ConfigError


@dataclass
class ResumePoint:
    run_id: str
    checkpoint: int | None  # newest checkpoint's step
    trajectory_steps: list[int]  # steps whose Arrow partition exists
    target: int


def saved_run_config(run_id: str, steps: int | None = None) -> RunConfig:
    """The run's saved config, ready to resume: no fault injection, `steps` if given."""
    path = data_dir() / "runs" / run_id / "config.json"
    if not path.is_file():
        runs = sorted(p.parent.name for p in (data_dir() / "runs").glob("*/config.json"))
        raise ConfigError(f"no run {run_id!r} in {data_dir() / 'runs'} "
                          f"(known: {', '.join(runs) or 'none'})")
    try:
        cfg = RunConfig.model_validate(json.loads(path.read_text()))
    except ValueError as e:
        raise ConfigError(f"{path} is not a valid run config: {str(e).splitlines()[0]}") from None
    cfg.fault_injection = {}
    if steps is not None:
        cfg.steps = steps
    return cfg


def resume_point(cfg: RunConfig) -> ResumePoint:
    from storage.checkpoints import checkpoint_steps
    from storage.trajectories.dataset import TrajectoryStore

    ckpts = checkpoint_steps(cfg.run_dir() / "checkpoints")
    return ResumePoint(cfg.run_id, ckpts[-1] if ckpts else None,
                       TrajectoryStore(cfg.trajectories_dir()).steps(cfg.run_id), cfg.steps)


def resume(run_id: str, steps: int | None = None, console=None) -> list[dict]:
    from rich.console import Console

    from rose.launch import run_training
    from coordination.run_lease import driving

    console = console or Console()
    cfg = saved_run_config(run_id, steps)
    with driving(cfg.run_dir(), cfg.run_id):  # a run another driver drives is not resumed
        point = resume_point(cfg)
        console.print(f"resuming run [bold]{run_id}[/]: last checkpoint "
                      f"{'none' if point.checkpoint is None else f'step {point.checkpoint}'}, "
                      f"trajectories of steps {point.trajectory_steps or 'none'}, "
                      f"target step {point.target}")
        return run_training(cfg, console)
