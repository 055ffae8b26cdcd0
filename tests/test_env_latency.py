"""Per-step environment latency: the run config's distribution, drawn once per step."""
from __future__ import annotations

import numpy as np
import pytest

from envs.latency import DelayedEnv, StepLatency
from envs.registry import make_env
from rose.config_file import ConfigError, load_run_config


def _delayed(latency: StepLatency, seed: int = 0) -> tuple[DelayedEnv, list[float]]:
    slept: list[float] = []
    env = DelayedEnv(make_env("frozenlake", max_turns=20), latency, rng=np.random.default_rng(seed),
                     sleep=slept.append)
    return env, slept


def test_each_step_sleeps_its_own_draw_from_the_distribution():
    latency = StepLatency("normal", mean_s=2.0, std_s=0.5)
    env, slept = _delayed(latency)
    env.reset(1)
    while not env.done:
        env.step(env.expert_reply())
    assert len(slept) == env.turn == len(env.delays) and slept == env.delays
    assert len(set(slept)) == len(slept)  # drawn per step, not once per episode
    expected = [max(0.0, float(x)) for x in np.random.default_rng(0).normal(2.0, 0.5, len(slept))]
    assert slept == expected


def test_negative_draws_are_clipped_and_zero_latency_never_sleeps():
    env, slept = _delayed(StepLatency("normal", mean_s=0.0, std_s=1.0))
    env.reset(0)
    for _ in range(6):
        if env.done:
            break
        env.step("Down")
    assert env.delays and min(env.delays) >= 0.0 and len(slept) == sum(d > 0 for d in env.delays)
    env, slept = _delayed(StepLatency())
    env.reset(0)
    env.step("Down")
    assert slept == [] and env.delays == [0.0]


def test_the_wrapper_is_the_inner_env_otherwise():
    plain = make_env("sokoban")
    env = DelayedEnv(make_env("sokoban"), StepLatency(), sleep=lambda s: None)
    assert (env.name, env.system_prompt, env.max_turns) == (plain.name, plain.system_prompt, plain.max_turns)
    assert env.reset(4) == plain.reset(4)
    reply = plain.expert_reply()
    assert env.expert_reply() == reply
    assert env.step(reply) == plain.step(reply) and env.turn == plain.turn == 1
    assert isinstance(make_env("guess", step_latency=StepLatency(mean_s=0.1)), DelayedEnv)


@pytest.mark.parametrize("kwargs, match", [
    ({"dist": "gamma"}, "not one of"), ({"mean_s": -1.0}, "mean_s"), ({"std_s": float("nan")}, "std_s")])
def test_bad_latencies_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StepLatency(**kwargs)


def test_the_run_config_sets_the_latency_in_one_line(tmp_path):
    cfg = load_run_config(None, {"rollout": {"env_step_latency": {"mean_s": 1.5, "std_s": 0.3}}})
    assert cfg.rollout.env_step_latency.dist == "normal" and cfg.rollout.env_step_latency.mean_s == 1.5
    assert load_run_config(None, {}).rollout.env_step_latency is None
    for bad, needle in [({"dist": "gamma"}, "rollout.env_step_latency.dist"),
                        ({"std_s": -0.1}, "rollout.env_step_latency.std_s"),
                        ({"mean": 1.0}, "unknown config key 'rollout.env_step_latency.mean'")]:
        with pytest.raises(ConfigError, match=needle) as e:
            load_run_config(None, {"rollout": {"env_step_latency": bad}})
        assert "\n" not in str(e.value)


def test_sokoban_needs_the_policy_warmed_up_on_it():
    with pytest.raises(ConfigError, match="models.demo_envs"):
        load_run_config(None, {"rollout": {"env": "sokoban"}})
    cfg = load_run_config(None, {"rollout": {"env": "sokoban"}, "models": {"demo_envs": ["sokoban", "frozenlake"]}})
    assert cfg.models.demo_envs == ["frozenlake", "sokoban"]
