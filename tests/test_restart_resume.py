"""Stop the whole stack in the middle of a 3-step run, start it again, resume: as a user does.

`rose train` (3 steps) fails in train of step 2, i.e. after step 1 completed and after step 2's
rollout and reward finished; `rose down` stops every process; `rose up` starts a fresh stack
(new ports, new engines, empty relay) on the same data directory; `rose resume` continues.
Checked: step 1 is not run again, step 2's rollout comes back `Cached` across the restart
(Prefect's database and result store live in the data directory), steps 2 and 3 complete, no
(trajectory, turn) row is duplicated in the Arrow dataset, and the trainer (reloaded from its
step-1 checkpoint), its checkpoints and the rollout worker (fed through the new relay) agree.
"""
from __future__ import annotations

import json

import pytest

from tests.stack_fixtures import (cli_stack_env, file_fingerprint, flow_runs, new_data_dir,
                                  prefect_for, rose_cli, task_states,
                                  trainer_and_worker_state)

pytestmark = [pytest.mark.slow, pytest.mark.models]
RUN = "restart-t"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    data = new_data_dir(tmp_path_factory, "rose-restart")
    with cli_stack_env(data) as env:
        yield data, env


def _counts(store, run: str) -> tuple[dict[int, int], int, int]:
    rows = store.query(f"SELECT step, count(*) AS n FROM turns WHERE run = '{run}' "
                       "GROUP BY step ORDER BY step").to_pylist()
    dup = store.query(f"SELECT count(*) AS n, count(DISTINCT (trajectory, turn)) AS d "
                      f"FROM turns WHERE run = '{run}'").to_pylist()[0]
    return {r["step"]: r["n"] for r in rows}, dup["n"], dup["d"]


def test_full_stack_restart_resumes_after_last_completed_step(data):
    data_dir, env = data
    from core.config import RolloutConfig, RunConfig, stack_dir
    from coordination.stack_record import load_stack
    from storage.checkpoints import checkpoint_steps
    from storage.trajectories.dataset import PART, TrajectoryStore

    cfg = RunConfig(run_id=RUN, steps=3, seed=3, fault_injection={"train": 2},
                    rollout=RolloutConfig(groups=2, group_size=4, max_turns=3))
    cfg_file = data_dir / "run.json"
    cfg_file.write_text(cfg.model_dump_json())
    first = rose_cli(["train", "--config", str(cfg_file)], env)
    assert first.returncode == 1 and "fault injected into train at step 2" in first.stderr
    store = TrajectoryStore(cfg.trajectories_dir())
    assert store.steps(RUN) == [1, 2]
    assert checkpoint_steps(cfg.run_dir() / "checkpoints")[-1] == 1
    step2 = file_fingerprint(store.step_dir(RUN, 2) / PART)
    counts_before, _, _ = _counts(store, RUN)

    down = rose_cli(["down"], env, timeout=120)
    assert down.returncode == 0, down.stderr
    assert load_stack(stack_dir()) is None and not (stack_dir() / "stack.json").exists()
    up = rose_cli(["up"], env, timeout=300)
    assert up.returncode == 0, up.stderr
    resumed = rose_cli(["resume", RUN], env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "last checkpoint step 1" in resumed.stdout

    counts, rows, distinct = _counts(store, RUN)
    assert rows == distinct  # no (trajectory, turn) twice
    assert sorted(counts) == [1, 2, 3]
    assert {s: counts[s] for s in (1, 2)} == counts_before
    assert file_fingerprint(store.step_dir(RUN, 2) / PART) == step2
    assert checkpoint_steps(cfg.run_dir() / "checkpoints") == [1, 2, 3]
    assert json.loads((cfg.run_dir() / "config.json").read_text())["fault_injection"] == {}

    handle = load_stack(stack_dir())
    with prefect_for(handle):
        [run] = flow_runs(f"{RUN}-step-1")  # not run again after the restart
        assert run.state.is_completed()
        failed, done2 = flow_runs(f"{RUN}-step-2")
        assert failed.state.is_failed() and done2.state.is_completed()
        assert task_states(done2) == {"rollout": "Cached", "reward": "Cached",
                                      "train": "Completed", "publish": "Completed"}
        [done3] = flow_runs(f"{RUN}-step-3")
        assert set(task_states(done3).values()) == {"Completed"}
    trainer, worker = trainer_and_worker_state(handle.dask_scheduler, RUN)
    assert trainer["version"] == worker["version"] == 3
    assert trainer["digest"] == worker["digest"]
