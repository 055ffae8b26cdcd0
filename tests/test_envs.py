import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.base import MultiTurnEnv, StepResult
from envs.frozenlake import FrozenLakeEnv, parse_action
from envs.guess import GuessEnv, parse_guess
from envs.registry import make_env


def _seed_where(pred, limit=500):
    env = FrozenLakeEnv()
    for seed in range(limit):
        env.reset(seed)
        if pred(env.desc):
            return seed
    pytest.skip("no such map in the searched seeds")


# -- registry -------------------------------------------------------------------------------


def test_registry_makes_both_envs_and_rejects_unknown():
    assert isinstance(make_env("frozenlake"), FrozenLakeEnv)
    assert isinstance(make_env("guess"), GuessEnv)
    assert make_env("guess", max_turns=3).max_turns == 3
    with pytest.raises(ValueError, match="unknown environment 'chess'"):
        make_env("chess")
    with pytest.raises(ValueError, match="max_turns"):
        make_env("frozenlake", max_turns=0)


# -- FrozenLake -------------------------------------------------------------------------------


def test_frozenlake_renders_grid_with_player_at_start():
    env = FrozenLakeEnv()
    obs = env.reset(3)
    lines = obs.split("\n")
    assert lines[-1] == "Your move?"
    grid = [row.split(" ") for row in lines[:4]]
    assert all(len(row) == 4 for row in grid)
    flat = [c for row in grid for c in row]
    assert set(flat) <= {"P", "H", "G", "."}
    assert grid[0][0] == "P" and grid[3][3] == "G" and flat.count("P") == 1
    assert flat.count("H") == sum(row.count("H") for row in env.desc)
    assert env.system_prompt and env.name == "frozenlake"


@pytest.mark.parametrize(
    "reply,action",
    [("Down", 1), ("  down.", 1), ("I go LEFT now", 0), ("Right", 2), ("up!", 3), ("d", 1), ("→", 2),
     ("Left, then Up", 0), ("", None), ("   ", None), ("downward", None), ("upright", None),
     ("⬇️", None), ("Ünïcødé ☃", None), ("<|im_end|>", None), ("42", None)],
)
def test_parse_action(reply, action):
    assert parse_action(reply) == action


def test_frozenlake_moves_follow_the_grid():
    env = FrozenLakeEnv()
    env.reset(0)
    r = env.step("Up")  # off the top edge: stays, told it hit a wall
    assert (r.reward, r.done, env.state) == (0.0, False, 0)
    assert r.info["valid_action"] and r.observation.startswith("Wall.\nP")
    if env.desc[0][1] != "H":
        r = env.step("Right")
        assert env.state == 1 and r.observation.split("\n")[0].split(" ")[1] == "P"


def test_frozenlake_hole_ends_episode_without_reward():
    seed = _seed_where(lambda d: d[0][1] == "H")
    env = FrozenLakeEnv()
    env.reset(seed)
    r = env.step("Right")
    assert r.done and r.reward == 0.0
    assert r.info == {**r.info, "success": False, "valid_action": True, "reason": "hole"}


def test_frozenlake_invalid_replies_penalised_then_end():
    env = FrozenLakeEnv()
    first = env.reset(5)
    r = env.step("I don't know")
    assert (r.reward, r.done) == (-0.1, False)
    assert r.info["valid_action"] is False and r.info["success"] is False
    assert r.observation.startswith("Invalid.") and first.split("\n")[:4] == r.observation.split("\n")[1:5]
    r = env.step("Up")  # a valid reply resets the count of invalid ones in a row
    assert r.info["valid_action"]
    assert not env.step("").done
    r = env.step("🙃")
    assert r.done and r.reward == -0.1 and r.info["reason"] == "invalid"


def test_frozenlake_turn_limit():
    env = FrozenLakeEnv(max_turns=3)
    env.reset(1)
    results = [env.step("Up") for _ in range(3)]  # bumps the wall three times
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].info["reason"] == "max_turns" and results[-1].reward == 0.0


def test_frozenlake_expert_solves_every_map():
    env = FrozenLakeEnv()
    for seed in range(100):
        env.reset(seed)
        total, r = 0.0, StepResult("", 0.0, False)
        while not r.done:
            r = env.step(env.expert_reply())
            total += r.reward
        assert r.info["success"] and total == 1.0 and env.turn <= env.max_turns, seed


def test_frozenlake_same_seed_same_initial_state_and_dynamics():
    a, b = FrozenLakeEnv(), FrozenLakeEnv()
    assert a.reset(11) == b.reset(11) and a.desc == b.desc
    for reply in ["Down", "garbage", "Right", "Right", "Down"]:
        ra, rb = a.step(reply), b.step(reply)
        assert ra == rb
        if ra.done:
            break
    maps = {FrozenLakeEnv().reset(s) for s in range(20)}
    assert len(maps) > 5  # different seeds give different maps


def test_step_outside_an_episode_raises():
    env = FrozenLakeEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Down")
    env.reset(0)
    env.step("x")
    env.step("x")
    with pytest.raises(RuntimeError, match="over"):
        env.step("Down")


# -- Guess ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply,guess", [("42", 42), ("I guess 7!", 7), (" 64 ", 64), ("1", 1), ("0", None), ("65", None),
                    ("-3", None), ("abc", None), ("", None), ("99999999999999", None), ("٣", None)],
)
def test_parse_guess(reply, guess):
    assert parse_guess(reply, 64) == guess


def test_guess_feedback_and_success():
    env = GuessEnv()
    assert env.reset(7) == "Your guess?"
    t = env.target
    low, high = (t - 1, t + 1)
    if low >= 1:
        r = env.step(str(low))
        assert r.observation == f"Higher than {low}." and not r.done and env.lo == t
    if high <= 64:
        r = env.step(str(high))
        assert r.observation == f"Lower than {high}." and env.hi == t
    r = env.step(f"it is {t}")
    assert r.done and r.reward == 1.0 and r.info["success"]


def test_guess_invalid_and_turn_limit():
    env = GuessEnv(max_turns=2)
    env.reset(0)
    r = env.step("seventy")
    assert (r.reward, r.done, r.info["valid_action"]) == (-0.1, False, False)
    wrong = 1 if env.target != 1 else 2
    r = env.step(str(wrong))
    assert r.done and r.reward == 0.0 and r.info["reason"] == "max_turns" and not r.info["success"]


def test_guess_binary_search_within_log2_turns():
    env = GuessEnv(high=64)
    bound = math.floor(math.log2(64)) + 1
    targets = set()
    for seed in range(200):
        env.reset(seed)
        targets.add(env.target)
        while True:
            r = env.step(env.expert_reply())
            if r.done:
                break
        assert r.info["success"] and env.turn <= bound
    assert len(targets) > 40  # seeds spread over the range
    a, b = GuessEnv(), GuessEnv()
    a.reset(99), b.reset(99)
    assert a.target == b.target


# -- any reply, any env: never crashes ---------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(["frozenlake", "guess", "sokoban"]), seed=st.integers(0, 2**31 - 1),
       replies=st.lists(st.text(max_size=40), min_size=1, max_size=10))
def test_any_reply_is_handled(name, seed, replies):
    env: MultiTurnEnv = make_env(name)
    obs = env.reset(seed)
    assert isinstance(obs, str) and obs
    for reply in replies:
        r = env.step(reply)
        assert r.reward in (-0.1, 0.0, 1.0)
        assert isinstance(r.info["success"], bool) and isinstance(r.info["valid_action"], bool)
        if r.done:
            break
