"""Sokoban: every generated level is solvable and long enough, the text round trip, rewards."""
from __future__ import annotations

import pytest

from envs.frozenlake import NAMES
from envs.registry import make_env
from envs.sokoban import OPPOSITE, EasySokobanEnv, SokobanEnv, generate


@pytest.mark.parametrize("boxes", [1, 2])
def test_the_generators_solution_solves_every_level(boxes):
    for seed in range(40):
        level = generate(seed, boxes=boxes)
        state = level.start
        assert not level.solved(state)
        for a in level.solution:
            state = level.move(state, a)
        assert level.solved(state), f"seed {seed}: the replayed solution leaves a box off target"
        shortest = level.shortest(level.start)
        assert 10 <= len(shortest) <= len(level.solution) <= 40


def test_easy_levels_are_small_short_and_solvable():
    env = make_env("sokoban_easy")
    assert isinstance(env, EasySokobanEnv) and env.max_turns < SokobanEnv.max_turns
    lengths = []
    for seed in range(40):
        env.reset(seed)
        assert env.level.size == 4 and len(env.render().splitlines()) == 4
        lengths.append(len(env.level.shortest(env.level.start)))
        while not env.done:
            r = env.step(env.expert_reply())
        assert r.info["success"]
    assert 2 <= min(lengths) and max(lengths) < 10 <= len(generate(0).shortest(generate(0).start))


def test_levels_are_seeded():
    assert generate(5) == generate(5)
    assert len({generate(s).start for s in range(20)}) > 15


def test_the_observation_shows_the_state_and_moves_round_trip():
    env = SokobanEnv()
    obs = env.reset(3)
    grid = obs.splitlines()[:env.level.size]
    (pr, pc), boxes = env.state
    assert grid[pr].split()[pc] in "Pp"
    assert all(grid[r].split()[c] in "B*" for r, c in boxes)
    assert sum(row.split().count("T") + row.split().count("p") for row in grid) == len(env.level.targets)
    # a move then its opposite, both unblocked and pushing nothing, gives the same text back
    for a in range(4):
        after = env.level.move(env.state, a)
        if after != env.state and after[1] == env.state[1]:
            break
    r = env.step(f"I go {NAMES[a].lower()}.")
    assert r.info["valid_action"] and env.state == after
    r = env.step(NAMES[OPPOSITE[a]][0].lower())  # a lone letter counts too
    assert r.observation == obs


def test_the_expert_solves_with_reward_one_and_a_wrong_reply_costs():
    env = make_env("sokoban")
    env.reset(11)
    r = env.step("jump")
    assert r.reward == env.invalid_penalty and not r.done and not r.info["valid_action"]
    rewards = []
    while True:
        r = env.step(env.expert_reply())
        rewards.append(r.reward)
        if r.done:
            break
    assert r.info["success"] and r.info["reason"] == "solved"
    assert rewards[-1] == 1.0 and set(rewards[:-1]) <= {0.0}
    assert env.turn - 1 == len(env.level.shortest(env.level.start))


def test_a_box_pushed_into_a_corner_ends_the_episode_unsolved():
    for seed in range(200):
        env = SokobanEnv()
        env.reset(seed)
        for a in range(4):  # a push that leaves the level unsolvable
            after = env.level.move(env.state, a)
            if after[1] != env.state[1] and env.level.shortest(after) is None:
                r = env.step(NAMES[a])
                assert r.done and r.reward == 0.0 and r.info["reason"] == "stuck"
                return
    pytest.fail("no seed of 200 starts next to a deadlocking push")


def test_out_of_turns_and_bad_specs():
    env = make_env("sokoban", max_turns=2)
    env.reset(0)
    env.step("Left"), env.step("Right")
    assert env.done
    with pytest.raises(ValueError, match="bad level spec"):
        SokobanEnv(boxes=0)


# -- warm-up ------------------------------------------------------------------------------------


def test_sokoban_demonstrations_are_opt_in():
    from rose.models.build import OPT_IN_DEMOS, BuildSpec, for_envs

    default = BuildSpec()
    assert for_envs(default, ["frozenlake", "guess"]) == default  # the default build is untouched
    with_sokoban = for_envs(default, ["frozenlake", "guess", "sokoban", "sokoban_easy"])
    assert {e: with_sokoban.demo_episodes[e] for e in OPT_IN_DEMOS} == OPT_IN_DEMOS
    assert with_sokoban.digest(0) != default.digest(0)


def test_noisy_sokoban_demonstrations_mostly_succeed_over_long_episodes():
    from rose.models.demos import demonstrations

    demos = demonstrations({"sokoban": 20}, noise=0.1, seed=0)
    wins = [d for d in demos if d.success]
    assert len(wins) >= len(demos) // 2 and all(len(d.turns) >= 10 for d in wins)
    assert all(d.final.startswith("A box is stuck") for d in demos if not d.success)
