"""Co-execution groups on the real stack (`rose train --group`; flows/coexec.py).

Slow: two `train` flows in one group at once on the shared stack (one trainer, one rollout
worker), then a run refused by the group's host memory. Checks: the group's permits are Prefect
global concurrency limits, the two runs' rollouts never overlap nor do their trainings, one run's
rollout overlaps the other's training, both runs' trajectories stay in their own partitions, and
a run that cannot fit is refused with its name and the memory.
"""
from __future__ import annotations

import contextvars
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.models]


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.handle


def overlap(a: list[float], b: list[float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def test_two_runs_in_a_group_take_turns_one_rolling_out_while_the_other_trains(stack):
    from prefect.client.orchestration import get_client

    from flows.coexec import limit_name
    from flows.train import train
    from core.config import RolloutConfig, RunConfig
    from storage.trajectories.dataset import TrajectoryStore

    tag = uuid.uuid4().hex[:6]
    group = f"g{tag}"
    cfgs = [RunConfig(run_id=f"co-{name}-{tag}", steps=2, seed=seed, coexec={"group": group},
                      rollout=RolloutConfig(groups=2, group_size=4, max_turns=3))
            for name, seed in (("a", 1), ("b", 2))]
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(contextvars.copy_context().run, train, cfg) for cfg in cfgs]
        summaries = {cfg.run_id: f.result() for cfg, f in zip(cfgs, futures)}

    with get_client(sync_client=True) as client:
        for p in ("rollout", "train"):
            assert client.read_global_concurrency_limit_by_name(limit_name(group, p)).limit == 1
    a, b = (summaries[cfg.run_id] for cfg in cfgs)
    for steps in (a, b):
        assert [s["step"] for s in steps] == [1, 2]
        assert all(s["coexec"]["group"] == group and s["coexec"]["refused"] == "" for s in steps)

    def spans(steps, *phases):
        return [[s["phase_spans"][phases[0]][0], s["phase_spans"][phases[-1]][1]] for s in steps]
    rollouts = {run: spans(steps, "rollout", "reward") for run, steps in summaries.items()}
    trains = {run: spans(steps, "train", "publish") for run, steps in summaries.items()}
    slack = 0.05  # a permit is released a moment before the phase's end is stamped
    ra, rb = rollouts.values()
    ta, tb = trains.values()
    assert all(overlap(x, y) <= slack for x in ra for y in rb), (ra, rb)  # one rollout at a time
    assert all(overlap(x, y) <= slack for x in ta for y in tb), (ta, tb)  # one training at a time
    # RollMux's point: one run's rollout fills the other's training
    overlapped = sum(overlap(x, y) for x in ra for y in tb) + sum(overlap(x, y) for x in rb for y in ta)
    assert overlapped > 0, (rollouts, trains)

    store = TrajectoryStore(cfgs[0].trajectories_dir())
    for cfg in cfgs:
        for step in (1, 2):
            rows = store.read_step(cfg.run_id, step).to_pylist()
            assert {r["run"] for r in rows} == {cfg.run_id} and {r["policy_version"] for r in rows} == {step - 1}
            assert len({r["trajectory"] for r in rows}) == 8


def test_a_run_that_cannot_fit_is_refused_naming_it_and_the_memory(stack):
    from executors.policies.coexec_group import CoexecGroupError
    from flows.train import train
    from core.config import RunConfig

    cfg = RunConfig(run_id=f"huge-{uuid.uuid4().hex[:6]}", steps=1,
                    coexec={"group": "tiny", "host_memory_gib": 0.001})  # 1 MiB: not even its weights
    with pytest.raises(CoexecGroupError, match=rf"run {cfg.run_id} cannot fit co-execution group tiny "
                       r"nor one of its own: its parked state takes \d+\.\d MiB of rollout-pool .* each pool "
                       r"has 1\.0 MiB \(coexec\.host_memory_gib\)"):
        train(cfg)
