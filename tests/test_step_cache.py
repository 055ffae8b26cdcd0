"""The cache key of a step's phases: what a resume may reuse and what it must recompute."""
from __future__ import annotations

import pytest

from core.config import RolloutConfig, RunConfig, StackConfig
from tasks.caching import STEP_CACHE, RunStepInputs

KEY = RunStepInputs()


def key(cfg: RunConfig, step: int = 2, **others) -> str | None:
    return KEY.compute_key(None, {"cfg": cfg, "step": step, **others}, {})


def test_same_run_and_step_give_the_same_key_across_operational_changes():
    base = RunConfig(run_id="r", steps=5, fault_injection={"train": 2})
    resumed = RunConfig(run_id="r", steps=10, checkpoint_every=3,
                        stack=StackConfig(rollout_workers=2, dask_scheduler="tcp://h:8786"))
    assert key(base, policy_version=1) == key(resumed, policy_version=1)


@pytest.mark.parametrize("change", [
    {"run_id": "other"},
    {"seed": 1},
    {"rollout": RolloutConfig(groups=3)},
])
def test_what_changes_the_data_changes_the_key(change):
    assert key(RunConfig(run_id="r")) != key(RunConfig(**{"run_id": "r", **change}))


def test_step_and_policy_version_are_part_of_the_key():
    cfg = RunConfig(run_id="r")
    assert key(cfg, 2, policy_version=1) != key(cfg, 3, policy_version=1)
    assert key(cfg, 2, policy_version=1) != key(cfg, 2, policy_version=0)


def test_no_key_without_cfg_and_step():
    assert KEY.compute_key(None, {"step": 1}, {}) is None
    assert KEY.compute_key(None, {"cfg": RunConfig()}, {}) is None


def test_rollout_and_reward_persist_with_the_step_key_train_and_publish_never_cache():
    from prefect.cache_policies import NO_CACHE

    from tasks.publish import publish
    from tasks.reward import reward
    from tasks.rollout import rollout
    from tasks.train import train

    for t in (rollout, reward):
        assert t.cache_policy == STEP_CACHE and t.persist_result is True
    for t in (train, publish):
        assert t.cache_policy == NO_CACHE
