"""One real RL step on the local stack: vLLM + Prefect server + Dask workers + Mooncake relay.

Slow (a minute or two): it starts every real service on the session's tiny models, runs the
`train` flow for one step and checks what landed where.
"""
from __future__ import annotations


import pytest

from tests.stack_fixtures import engine_mismatches, flow_runs

pytestmark = [pytest.mark.slow, pytest.mark.models]


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.handle


def test_one_rl_step_end_to_end(stack):
    import pyarrow.compute as pc
    from distributed import Client

    from executors.workers.rollout_worker import worker_state
    from storage.weights.digest import tensors_digest
    from executors.workers.trainer import local_trainer
    from flows.train import train
    from core.config import RolloutConfig, RunConfig
    from core.grpo import assemble_trajectory
    from storage.trajectories.dataset import TrajectoryStore
    from storage.trajectories.schema import TURN_SCHEMA

    import uuid

    run = f"e2e-{uuid.uuid4().hex[:8]}"  # a reused data dir must not resume an older run
    cfg = RunConfig(run_id=run, steps=1, rollout=RolloutConfig(groups=2, group_size=4,
                                                                 max_turns=4),
                    reward={"service": "elastic"})
    [summary] = train(cfg)
    assert summary["step"] == 1 and summary["policy_version"] == 1
    assert summary["trajectories"] == 8 and summary["turns"] >= 8
    # the shared stack has environment workers: every environment stepped there, none lost
    assert summary["env_hosts"] == {"workers": ["env-0", "env-1"], "relaunches": 0, "failed_on": {}}
    # ... and a reward pool: every trajectory scored there as it ended, as its environment said
    pool = summary["reward_service"]
    assert pool["service"] == "elastic" and pool["trajectories"] == 8 and pool["mismatches"] == 0, pool
    assert pool["peak_workers"] == 1 and pool["busy_seconds"] > 0, pool

    table = TrajectoryStore(cfg.trajectories_dir()).read_step(run, 1)
    assert table.schema.remove_metadata().equals(TURN_SCHEMA.remove_metadata())
    assert table.num_rows == summary["turns"]
    assert set(pc.unique(table["trajectory"]).to_pylist()) == {
        f"s1-g{g}-t{i}" for g in range(2) for i in range(4)}
    assert set(table["worker"].to_pylist()) == {"rollout-0"}
    assert set(table["worker_kind"].to_pylist()) == {"rollout"}
    assert table["policy_version"].to_pylist() == [0] * table.num_rows
    assert all(a is not None for a in table["advantage"].to_pylist())
    rows = table.to_pylist()
    for tid in {r["trajectory"] for r in rows}:
        turns = sorted((r for r in rows if r["trajectory"] == tid), key=lambda r: r["turn"])
        assemble_trajectory([(r["prompt_ids"], r["response_ids"]) for r in turns])  # consistent
        assert turns[-1]["done"] and not any(r["done"] for r in turns[:-1])
        assert all(len(r["logprobs"]) == len(r["response_ids"]) for r in turns)

    with Client(stack.dask_scheduler) as client:
        state = client.submit(worker_state, workers=["rollout-0"], pure=False).result()
        trainer_digest = client.submit(
            lambda: tensors_digest(local_trainer(run).weights_bf16()),
            resources={"train_gpu": 1}, pure=False).result()
    assert state["version"] == 1 and state["run"] == run
    assert state["digest"] == trainer_digest  # the receiver got what the trainer published
    # and the engine runs it: every weight read from inside vLLM equals the trainer's bf16 one
    assert engine_mismatches(stack.dask_scheduler, run) == []

    _assert_prefect_runs(cfg.run_id)


def _assert_prefect_runs(run_id: str) -> None:
    runs = flow_runs(f"{run_id}-step-1")
    assert len(runs) == 1 and runs[0].state.is_completed()
    assert {t.name.split("-")[0] for t in runs[0].tasks} >= {"rollout", "reward", "train", "publish"}
    assert all(t.state.is_completed() for t in runs[0].tasks)
