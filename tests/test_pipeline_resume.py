"""One-step off-policy on the real stack: the run stops between two overlapping phases, resumes.

max_staleness = 1, 4 steps. Step 3's train fails (fault injection) while step 4's rollout runs
beside it on the trainer worker: the fault waits until it sees that rollout's task, so the run
really stops with a rollout in flight ahead of training. Checked: the phases overlapped in
Prefect's task-run times; step 4's rollout and reward finished before the run stopped and its
train never started; the resumed run gets both steps' rollout and reward back `Cached` (Arrow
files untouched), trains 3 and 4 once each; the dataset holds every (trajectory, turn) once;
every turn records the version that produced it and lags the trainer that trains on it by at
most one version, and the trainer weighted the lagging turns' tokens (TIS).
"""
from __future__ import annotations

import pytest

from tests.stack_fixtures import (file_fingerprint, flow_runs, task_states,
                                  trainer_and_worker_state)

pytestmark = [pytest.mark.slow, pytest.mark.models]
RUN = "pipeline-resume-t"


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.handle


def _task(run, name: str):
    return next(t for t in run.tasks if t.name.rsplit("-", 1)[0] == name)


def test_stopped_with_a_rollout_in_flight_resumes_without_loss_or_recompute(stack):
    from flows.train import train
    from core.config import RolloutConfig, RunConfig
    from rose.resume import saved_run_config
    from storage.trajectories.dataset import PART, TrajectoryStore
    from tasks.train import InjectedFault

    # half the default rollout: train (~3 s here) outlasts the next step's rollout
    cfg = RunConfig(run_id=RUN, steps=4, seed=11, max_staleness=1,
                    fault_injection={"train_overlapped": 3},
                    rollout=RolloutConfig(groups=8, group_size=8, max_turns=6))
    with pytest.raises(InjectedFault, match="beside the next step.s rollout"):
        train(cfg)
    store = TrajectoryStore(cfg.trajectories_dir())
    assert store.steps(RUN) == [1, 2, 3, 4]  # step 4's rollout finished as the run stopped
    files = {s: file_fingerprint(store.step_dir(RUN, s) / PART) for s in (3, 4)}
    assert trainer_and_worker_state(stack.dask_scheduler, RUN)[0]["version"] == 2

    [failed3], [failed4] = flow_runs(f"{RUN}-step-3"), flow_runs(f"{RUN}-step-4")
    assert task_states(failed3) == {"rollout": "Completed", "reward": "Completed",
                                    "train": "Failed"}
    assert task_states(failed4) == {"rollout": "Completed", "reward": "Completed"}
    assert _task(failed4, "rollout").start_time < _task(failed3, "train").end_time  # overlap

    summaries = train(saved_run_config(RUN))  # what `rose resume` runs
    assert [s["step"] for s in summaries] == [3, 4]
    for s in summaries:
        assert s["phase_states"] == {"rollout": "Cached", "reward": "Cached",
                                     "train": "Completed", "publish": "Completed"}
        assert not s["train_resumed"] and s["rollout_version"] == s["step"] - 2
    assert {s: file_fingerprint(store.step_dir(RUN, s) / PART) for s in (3, 4)} == files

    dup = store.query(f"SELECT count(*) AS n, count(DISTINCT (trajectory, turn)) AS d "
                      f"FROM turns WHERE run = '{RUN}'").to_pylist()[0]
    assert dup["n"] == dup["d"]
    lags = store.query(f"SELECT step, step - 1 - policy_version AS lag, count(*) AS n FROM turns "
                       f"WHERE run = '{RUN}' GROUP BY ALL ORDER BY ALL").to_pylist()
    # the trainer holds version step-1 when it trains a step: never more than one behind it
    assert {r["lag"] for r in lags} <= {0, 1} and any(r["lag"] == 1 for r in lags)
    assert all(r["lag"] == 0 for r in lags if r["step"] == 1)  # step 1: version 0, on-policy
    stale_steps = {r["step"] for r in lags if r["lag"] == 1}
    trained = {s["step"]: s["stale_tokens"] for s in summaries}
    assert all(trained[s] > 0 for s in stale_steps & set(trained))  # TIS weighted them

    trainer, worker = trainer_and_worker_state(stack.dask_scheduler, RUN)
    assert trainer["version"] == worker["version"] == 4
    assert trainer["digest"] == worker["digest"]
