"""Resume a failed step on the real stack: nothing finished is redone, the policy stays exact.

A fault is injected into train at step 2 (after that step's rollout and reward finished), then
the run is resumed. Checked: step 2's rollout and reward come back `Cached` from Prefect's
result store and its Arrow file is untouched (mtime and hash); train runs once for step 2;
the final fp32 master weights, AdamW state and bf16 weights equal those of an uninterrupted
training over the same trajectories; trainer, checkpoint and rollout worker agree on the
version and the bits.

Why not compare with a second, uninterrupted run on the stack: rollout sampling draws from the
vLLM engine's one seeded generator (requests carry no per-request seed) in whatever order the
turns arrive, so two runs with the same seed sample different trajectories; training is
deterministic given the trajectories, so the reference replays this run's own trajectories.
"""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tests.stack_fixtures import (file_fingerprint, flow_runs, rose_cli,
                                  task_states, trainer_and_worker_state)

pytestmark = [pytest.mark.slow, pytest.mark.models]
RUN = "resume-t"
DEPLOYED: list = []  # the worker record of `rose deploy`, checked at teardown


@pytest.fixture(scope="module")
def stack(shared_stack):
    yield shared_stack.handle

    def deployed_worker_stopped(stopped: list[str]) -> None:
        # `rose down` (stop_stack) also stops the worker `rose deploy` started
        assert "prefect-worker" in stopped and not DEPLOYED[0].alive()

    if DEPLOYED:
        shared_stack.after_stop(deployed_worker_stopped)


def _cfg(**kw):
    from core.config import RolloutConfig, RunConfig

    return RunConfig(run_id=RUN, steps=3, seed=7,
                     rollout=RolloutConfig(groups=2, group_size=4, max_turns=3), **kw)


def test_failed_train_resumes_without_redoing_rollout(stack):
    from flows.train import train
    from rose.resume import saved_run_config
    from storage.checkpoints import checkpoint_steps
    from storage.trajectories.dataset import PART, TrajectoryStore
    from tasks.train import InjectedFault

    cfg = _cfg(fault_injection={"train": 2}, reward={"service": "batch"})  # scored on the reward pool
    with pytest.raises(InjectedFault):
        train(cfg)
    store = TrajectoryStore(cfg.trajectories_dir())
    assert store.steps(RUN) == [1, 2]  # step 2's rollout finished before train failed
    step2 = store.step_dir(RUN, 2) / PART
    before = file_fingerprint(step2)
    trainer, _ = trainer_and_worker_state(stack.dask_scheduler, RUN)
    assert trainer["version"] == 1

    t0 = time.perf_counter()
    summaries = train(saved_run_config(RUN))  # what `rose resume` runs
    resume_s = time.perf_counter() - t0
    assert [s["step"] for s in summaries] == [2, 3]
    assert summaries[0]["phase_states"] == {"rollout": "Cached", "reward": "Cached",
                                            "train": "Completed", "publish": "Completed"}
    assert not summaries[0]["train_resumed"]  # the update of step 2 ran now, exactly once
    pool = summaries[1]["reward_service"]  # step 3: every trajectory scored after its rollout
    assert pool["service"] == "batch" and pool["trajectories"] == 8 and pool["mismatches"] == 0, pool
    assert file_fingerprint(step2) == before
    assert any((Path(stack.prefect_home) / "storage").iterdir())  # results live in the stack

    failed, resumed = flow_runs(f"{RUN}-step-2")
    assert failed.state.is_failed() and resumed.state.is_completed()
    assert task_states(failed) == {"rollout": "Completed", "reward": "Completed",
                                   "train": "Failed"}
    states = task_states(resumed)
    assert states["rollout"] == states["reward"] == "Cached"
    assert states["train"] == states["publish"] == "Completed"
    [step3] = flow_runs(f"{RUN}-step-3")
    assert set(task_states(step3).values()) == {"Completed"}  # new step: computed, not cached
    cached = sum(v == "Cached" for r in (resumed, step3) for v in task_states(r).values())
    print(f"\nresume: {resume_s:.1f} s for steps 2-3, {cached} task runs cached")

    trainer, worker = trainer_and_worker_state(stack.dask_scheduler, RUN)
    assert trainer["version"] == worker["version"] == 3
    assert trainer["digest"] == worker["digest"]  # the relay carried exactly version 3
    assert checkpoint_steps(cfg.run_dir() / "checkpoints") == [1, 2, 3]
    _assert_equals_uninterrupted_training(cfg, trainer["digest"])


def _assert_equals_uninterrupted_training(cfg, trainer_digest: str) -> None:
    """Train steps 1..3 in one go on the same trajectories; compare every bit of state."""
    import torch

    from storage.weights.digest import tensors_digest
    from executors.workers.trainer import Trainer
    from storage.checkpoints import load_latest_checkpoint
    from storage.trajectories.dataset import TrajectoryStore

    torch.set_num_threads(cfg.train.threads)  # as the trainer worker
    reference = Trainer(cfg.model_copy(update={"run_id": f"{RUN}-reference",
                                               "fault_injection": {}}))
    assert reference.version == 0
    store = TrajectoryStore(cfg.trajectories_dir())
    for step in (1, 2, 3):
        reference.train_step(store.read_step(RUN, step))
    assert tensors_digest(reference.weights_bf16()) == trainer_digest
    ckpt = load_latest_checkpoint(cfg.run_dir() / "checkpoints")
    assert ckpt.step == 3
    for name, p in reference.model.named_parameters():
        assert torch.equal(ckpt.model_state[name], p.detach()), name
    ref_opt = reference.optimizer.state_dict()["state"]
    for idx, state in ckpt.optimizer_state["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[key], ref_opt[idx][key]), (idx, key)


def test_deployments_run_on_the_stack_with_validated_forms(stack):
    """`rose deploy` on the running stack; a train run started through the API completes.

    Shares this module's stack (engines already loaded) to keep the suite short.
    """
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from core.config import stack_dir
    from rose.deploy import DEPLOYMENTS, WORKER, running_worker

    out = rose_cli(["deploy"], dict(os.environ), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    worker = running_worker(stack_dir())
    assert worker is not None and worker.name == WORKER
    DEPLOYED.append(worker)
    again = rose_cli(["deploy"], dict(os.environ), timeout=300)
    assert again.returncode == 0 and "(reused)" in again.stdout
    assert running_worker(stack_dir()).pid == worker.pid

    async def inspect():
        async with get_client() as client:
            names = [f"{(await client.read_flow(d.flow_id)).name}/{d.name}"
                     for d in await client.read_deployments()]
            train = await client.read_deployment_by_name("train/train")
            with pytest.raises(Exception, match="cfg.rollout.groups"):
                await client.create_flow_run_from_deployment(
                    train.id, parameters={"cfg": {"rollout": {"groups": 0}}})
            return names, train.parameter_openapi_schema

    names, schema = asyncio.run(inspect())
    assert set(DEPLOYMENTS) <= set(names)
    form = schema["properties"]["cfg"]
    from core.config import RunConfig

    assert form["default"]["rollout"]["groups"] == RunConfig().rollout.groups  # defaults fill it
    assert "RunConfig" in schema["definitions"]

    params = {"cfg": {"run_id": "deployed", "steps": 1,
                      "rollout": {"groups": 2, "group_size": 4, "max_turns": 3}}}
    run = run_deployment("train/train", parameters=params, timeout=900, poll_interval=1)
    assert run.state.is_completed(), run.state
    [step] = flow_runs("deployed-step-1")
    assert step.state.is_completed()

    async def artifacts():
        async with get_client() as client:
            return {a.key: a for a in await client.read_artifacts()}

    found = asyncio.run(artifacts())
    table = found["deployed-step-1"]
    assert table.type == "table" and table.flow_run_id == step.run.id
    assert found["deployed-step-1-summary"].type == "markdown"
    assert "SLO attainment (serving)" in str(table.data)

    # A failed deployment run retried the way the UI's Retry button does it.
    failing = {"cfg": {**params["cfg"], "run_id": "retried", "steps": 2,
                       "fault_injection": {"train": 2}}}
    run = run_deployment("train/train", parameters=failing, timeout=600, poll_interval=1)
    assert run.state.is_failed()
    run = asyncio.run(_retry_like_the_ui(run.id))
    assert run.state.is_completed() and run.run_count == 2, run.state
    first, retried = flow_runs("retried-step-2")
    assert first.state.is_failed() and retried.state.is_completed()
    assert task_states(retried) == {"rollout": "Cached", "reward": "Cached",
                                    "train": "Completed", "publish": "Completed"}
    assert len(flow_runs("retried-step-1")) == 1  # the completed step was not run again


async def _retry_like_the_ui(flow_run_id, timeout: float = 600.0):
    """POST set_state AwaitingRetry (force false), as the UI does; wait for the worker's run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import State, StateType

    await _process_gone(str(flow_run_id))
    async with get_client() as client:
        await _state_settled(client, flow_run_id)
        result = await client.set_flow_run_state(flow_run_id, State(
            type=StateType.SCHEDULED, name="AwaitingRetry", message="Retry from the UI"))
        assert result.status.value == "ACCEPT", result
        deadline = time.monotonic() + timeout
        while True:
            run = await client.read_flow_run(flow_run_id)
            if run.run_count >= 2 and run.state.is_final():
                return run
            assert time.monotonic() < deadline, f"retry not done: {run.state}"
            await asyncio.sleep(1)


async def _state_settled(client, flow_run_id, quiet_s: float = 3.0, timeout: float = 60.0) -> None:
    """Wait until the run's state stops changing: the process worker reports a non-zero exit as
    Crashed ~0.1 s after the process is gone, and a Retry set before that report is overwritten
    by it (seen in a full run: the retry never ran). A person clicks Retry after the report."""
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        state = (await client.read_flow_run(flow_run_id)).state
        if state.id != last:
            last, since = state.id, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"flow run {flow_run_id} kept changing state for {timeout:g} s")


async def _process_gone(flow_run_id: str, timeout: float = 120.0) -> None:
    """Wait until the failed run's process has exited. A person clicks Retry seconds later;
    Prefect 3.7's process worker crashes a retry of a flow run whose previous process is still
    exiting (both map to one flow run id and the older exit tears down the newer one)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("PREFECT__FLOW_RUN_ID") == flow_run_id:
                    alive.append(proc.pid)
            except psutil.Error:
                continue
        if not alive:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"the process of flow run {flow_run_id} did not exit")
