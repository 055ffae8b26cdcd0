"""A rollout worker PROCESS is killed mid-step on the real local stack; nothing is lost.

Slow (a few minutes): starts Prefect, the Dask scheduler, a trainer and two vLLM rollout
workers, and runs two RL steps through the `train` flow. During a step the test
(tests/faults.py, from outside the product) SIGKILLs rollout-1's nanny and worker process once it
has finished two turn batches and is running a third. The step must complete with every
trajectory, the turns that were in flight on rollout-1 re-run on rollout-0 and recorded as
"rerouted"; step 2 must run too. The stack's supervisor starts rollout-1 again (a fresh worker
at policy v0, recorded as a restart); the scheduler lets it rejoin after a weight sync or
leaves it out (tests/test_rollout_scheduler.py), so step 2 may or may not use it.

    ROSE_TEST_MODELS_DIR=/tmp/x/models .venv/bin/pytest -m slow tests/test_fault_reroute.py
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.stack_fixtures import in_process_stack

pytestmark = [pytest.mark.slow, pytest.mark.models]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from core.config import StackConfig

    with in_process_stack(tmp_path_factory, "rose-fault",
                          config=StackConfig(rollout_workers=2, relay="filesystem")) as handle:
        yield handle


def test_killed_rollout_worker_loses_no_trajectory(stack):
    from flows.train import train
    from core.config import RolloutConfig, RunConfig
    from core.grpo import assemble_trajectory
    from coordination.stack_record import read_stack
    from storage.trajectories.dataset import TrajectoryStore
    from tests.faults import KillMidRollout

    cfg = RunConfig(run_id="fault", steps=2,
                    rollout=RolloutConfig(groups=4, group_size=4, max_turns=4,
                                          max_concurrency_per_worker=8))
    kill = KillMidRollout(stack.dask_scheduler, "rollout-1", after_batches=2)
    kill.start()
    summaries = train(cfg)
    assert [s["step"] for s in summaries] == [1, 2]
    killed = kill.result()
    assert killed["worker"] == "rollout-1" and killed["nanny_pid"]
    store = TrajectoryStore(cfg.trajectories_dir())
    for step in (1, 2):
        rows = store.read_step("fault", step).to_pylist()
        tids = {r["trajectory"] for r in rows}
        assert tids == {f"s{step}-g{g}-t{i}" for g in range(4) for i in range(4)}
        for tid in tids:  # every trajectory whole: turns 0..n-1, ends done, tokens consistent
            turns = sorted((r for r in rows if r["trajectory"] == tid), key=lambda r: r["turn"])
            assert [r["turn"] for r in turns] == list(range(len(turns)))
            assert turns[-1]["done"] and not any(r["done"] for r in turns[:-1])
            assemble_trajectory([(r["prompt_ids"], r["response_ids"]) for r in turns])
        assert all(r["advantage"] is not None for r in rows)  # reward and train ran on them

    # the step the kill struck: rollout-1 may finish only two batches in step 1 (routing and
    # load decide how many it gets), and then its third runs in step 2
    struck = [s["step"] for s in summaries if "rollout-1" in (s["dead_workers"] or ())]
    assert struck, "no step reported rollout-1 dead"
    hit = struck[0]
    rows = store.read_step("fault", hit).to_pylist()
    rerouted = [r for r in rows if r["status"] == "rerouted"]
    # the turns in flight on the killed worker were re-run on the survivor, and counted
    assert rerouted and all(r["worker"] == "rollout-0" for r in rerouted)
    assert summaries[hit - 1]["rerouted_turns"] >= len(rerouted)

    # the supervisor started the killed worker again, and said so in the stack file
    restarted = [r for r in read_stack(Path(stack.run_dir)).restarts if r["service"] == "worker-rollout-1"]
    assert restarted and restarted[0]["restart"] == 1, read_stack(Path(stack.run_dir)).restarts
    for later in range(hit + 1, 3):
        assert {r["worker"] for r in store.read_step("fault", later).to_pylist()} <= {"rollout-0", "rollout-1"}


def test_dynamic_sampling_step_keeps_whole_groups(stack):
    """DAPO dynamic sampling through the real flow: only kept groups reach the Arrow step,
    each whole, reward and train accept them, and the next step's launch target is saved."""
    from flows.train import train
    from core.config import RolloutConfig, RunConfig
    from storage.trajectories.dataset import TrajectoryStore
    from tasks.rollout import SAMPLING_FILE

    cfg = RunConfig(run_id="dapo", steps=1,
                    rollout=RolloutConfig(groups=2, group_size=4, max_turns=4,
                                          dynamic_sampling=True, dynamic_sampling_oversample=2.0,
                                          dynamic_sampling_max_launch=3.0))
    [summary] = train(cfg)
    rows = TrajectoryStore(cfg.trajectories_dir()).read_step("dapo", 1).to_pylist()
    groups: dict[int, set[str]] = {}
    for r in rows:
        groups.setdefault(r["group"], set()).add(r["trajectory"])
    assert len(groups) == 2 and all(len(t) == 4 for t in groups.values())
    assert summary["trajectories"] == 8 and all(r["advantage"] is not None for r in rows)
    saved = json.loads((cfg.run_dir() / SAMPLING_FILE).read_text())
    assert saved["step"] == 1 and 2 <= saved["next_launch"] <= 6
    assert saved["groups_launched"] >= 4  # ceil(2 * 2.0) up front
    varied = [g for g, t in groups.items()
              if len({r["trajectory_reward"] for r in rows if r["group"] == g}) > 1]
    assert len(varied) == min(2, saved["groups_varied"])  # varied groups first, then filler
