"""The training run: N RL steps, each its own `rl_step` flow run, from the last checkpoint on.

    python -m flows.train --steps 5        (or `rose train`, which also starts the stack)
"""
from __future__ import annotations

import argparse

from distributed import Client
from prefect import flow
from prefect_dask import DaskTaskRunner

from dashboards.events import emit
from executors.rollout_worker import RolloutWorkerPlugin
from executors.trainer import TrainerPlugin, local_trainer
from flows.rl_step import rl_step
from rose.config import RunConfig
from tasks.publish import publish_and_sync

ON_TRAINER = {"resources": {"train_gpu": 1}}


def dask_address(cfg: RunConfig) -> str:
    """The configured scheduler, else the local stack's (started by `rose up`)."""
    if cfg.stack.dask_scheduler:
        return cfg.stack.dask_scheduler
    from rose.config import stack_dir
    from rose.stack.local_stack import load_stack

    handle = load_stack(stack_dir())
    if handle is None:
        raise RuntimeError("no Dask scheduler: start the local stack with `rose up` or set "
                           "stack.dask_scheduler to an existing one")
    return handle.dask_scheduler


def attach_executors(client: Client, cfg: RunConfig) -> int:
    """Register the long-lived executors (idempotent) and return the trainer's policy version."""
    from tasks.placement import require, workers_by_kind

    kinds = workers_by_kind(client)
    require(kinds, "trainer"), require(kinds, "rollout")
    client.register_plugin(RolloutWorkerPlugin(cfg.models.policy_path()), name="rose-rollout")
    trainer = TrainerPlugin(cfg)
    client.register_plugin(trainer, name=trainer.name)
    return client.submit(lambda run: local_trainer(run).version, cfg.run_id, pure=False,
                         **ON_TRAINER).result()


@flow(name="train", flow_run_name="{cfg.run_id}", log_prints=True)
def train(cfg: RunConfig) -> list[dict]:
    """Run steps (last completed + 1) .. cfg.steps; each step is an `rl_step` flow run."""
    address = dask_address(cfg)
    with Client(address) as client:
        version = attach_executors(client, cfg)
        emit("run_start", run=cfg.run_id, start_version=version, steps=cfg.steps)
        # The relay may have lost its objects (restart): publish what the trainer holds now.
        client.submit(publish_and_sync, cfg, version, pure=False, **ON_TRAINER).result()
    step_flow = rl_step.with_options(task_runner=DaskTaskRunner(address=address))
    summaries = [step_flow(cfg, step) for step in range(version + 1, cfg.steps + 1)]
    emit("run_end", run=cfg.run_id, summaries=summaries)
    return summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--run-id", default="demo")
    args = parser.parse_args()
    train(RunConfig(run_id=args.run_id, steps=args.steps))


if __name__ == "__main__":
    main()
