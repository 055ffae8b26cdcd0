"""The elastic reward pool's policy (executors/policies/reward_pool.py) and the stateless scorer
(executors/workers/reward_host.py)."""
from __future__ import annotations

import pytest

from envs.registry import make_env
from executors.policies.reward_pool import PoolUsage, RewardPoolPolicy, Scored
from executors.workers.reward_host import RewardJob, score_trajectory


def test_target_follows_the_queue_between_min_and_cap():
    p = RewardPoolPolicy(max_workers=3, min_workers=0, trajectories_per_worker=4)
    assert p.target(0) == 0  # idle: no worker
    assert p.target(1) == 1 and p.target(4) == 1 and p.target(5) == 2
    assert p.target(1000) == 3  # the cap
    assert RewardPoolPolicy(max_workers=3, min_workers=1).target(0) == 1


@pytest.mark.parametrize("kwargs", [dict(max_workers=0), dict(max_workers=2, min_workers=3),
                                    dict(max_workers=2, trajectories_per_worker=0),
                                    dict(max_workers=2, wait_count=0)])
def test_bad_pool_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        RewardPoolPolicy(**kwargs)
    with pytest.raises(ValueError):
        RewardPoolPolicy(2).target(-1)


def test_usage_counts_busy_over_up_time_queueing_and_scale_up_delay():
    # reward-0 up 10..20 (2 threads), reward-1 up 12..16; four trajectories scored
    up = {"reward-0": [(10.0, 20.0)], "reward-1": [(12.0, None)]}
    scored = [Scored("reward-0", 9.0, 10.5, 12.5), Scored("reward-0", 9.0, 10.5, 11.5),
              Scored("reward-1", 11.0, 12.0, 15.0), Scored("reward-1", 14.0, 14.0, 15.0)]
    usage = PoolUsage(10.0, 16.0, up, scored, scale_ups=[(9.0, 10.0), (11.0, 12.0), (30.0, 31.0)])
    s = usage.summary(threads=2)
    assert s["worker_seconds"] == pytest.approx(6.0 + 4.0)  # clipped to the window
    assert s["busy_seconds"] == pytest.approx(2.0 + 1.0 + 3.0 + 1.0)
    assert s["utilization"] == pytest.approx(7.0 / (10.0 * 2))
    assert s["queue_s_mean"] == pytest.approx((1.5 + 1.5 + 1.0 + 0.0) / 4) and s["queue_s_max"] == 1.5
    assert s["scale_ups"] == 1 and s["scale_up_s_max"] == pytest.approx(1.0)  # the one asked inside
    assert s["peak_workers"] == 2
    with pytest.raises(ValueError):
        PoolUsage(2.0, 1.0, {}, [], [])
    assert PoolUsage(0.0, 1.0, {}, [], []).summary()["utilization"] is None


@pytest.mark.parametrize("env_name", ["frozenlake", "sokoban_easy"])
def test_the_scorer_gives_the_environments_own_reward_from_seed_and_replies(env_name):
    """Replayed from the trajectory alone, the reward is the rollout environment's sum."""
    env = make_env(env_name, max_turns=8)
    env.reset(7)
    replies, total = [], 0.0
    while not env.done:
        reply = env.expert_reply()
        replies.append(reply)
        total += env.step(reply).reward
    assert total > 0  # the expert solves it: a reward that could be missed
    got = score_trajectory(RewardJob("r", "t0", env_name, 7, tuple(replies), 8, submitted=0.0))
    assert got.reward == pytest.approx(total) and got.success
    wrong = score_trajectory(RewardJob("r", "t0", env_name, 7, ("nonsense",) * len(replies), 8, 0.0))
    assert wrong.reward < total and not wrong.success


def test_a_run_asking_for_the_pool_on_a_stack_without_one_is_told_how_to_start_it(tmp_path, monkeypatch):
    from core.config import RunConfig
    from tasks.rollout import require_reward_pool

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))  # its stack directory has no reward_pool.json
    require_reward_pool(RunConfig())  # reward.service env: no pool needed
    for service in ("elastic", "batch"):
        with pytest.raises(RuntimeError, match="rose up --reward-workers"):
            require_reward_pool(RunConfig(reward={"service": service}))
    (tmp_path / "stack").mkdir()
    (tmp_path / "stack" / "reward_pool.json").write_text('{"workers": {}}')
    require_reward_pool(RunConfig(reward={"service": "elastic"}))  # the controller's record: a pool


def test_rose_status_says_how_many_reward_workers_are_up(tmp_path):
    import json

    from rose.stack.status import reward_pool_cell

    assert reward_pool_cell(tmp_path) == "starting"  # the controller has not written its record yet
    (tmp_path / "reward_pool.json").write_text(json.dumps({
        "policy": {"max_workers": 3}, "scale_ups": [[10.0, 12.5], [20.0, 21.0]],
        "workers": {"reward-0": [[12.5, 30.0]], "reward-1": [[21.0, None]]}}))
    assert reward_pool_cell(tmp_path) == "1 of at most 3 reward workers up, last scale-up 1.0 s"
