"""Co-execution groups (executors/policies/coexec_group.py): the phase-level round robin, the
T_co estimate it yields, admission by residency and the SLO rule, and a run sent to a group of its
own with the reason."""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executors.policies.coexec_group import (
    ROLLOUT,
    TRAIN,
    CoexecGroup,
    CoexecGroupError,
    PhaseTurns,
    PoolLimits,
    RunProfile,
    check_admission,
    co_step_times,
    fits,
    join_group,
    play_round_robin,
)

GIB = 2**30
ROOMY = PoolLimits(rollout_host_bytes=1000 * GIB, train_host_bytes=1000 * GIB)


def test_complementary_runs_fill_each_others_bubbles():
    # a rolls out long and trains short, b the other way: each one's training hides in the other's rollout
    times = co_step_times([RunProfile("a", 10, 1), RunProfile("b", 1, 10)])
    assert times == {"a": pytest.approx(11), "b": pytest.approx(11)}


def test_a_saturated_pool_sets_the_pace():
    twins = [RunProfile(r, 100, 50) for r in ("a", "b")]
    assert co_step_times(twins) == {"a": pytest.approx(200), "b": pytest.approx(200)}  # two rollouts a round
    with_switches = co_step_times(twins, switch_s=3)
    assert all(t > 200 for t in with_switches.values())


def test_rollout_pools_of_their_own_share_one_trainer():
    # RollMux's rollout scaling: three rollout-heavy runs, each its own rollout pool, one trainer pool
    runs = [RunProfile(r, 100, 30, rollout_pool=f"rollout/{r}") for r in "abc"]
    assert co_step_times(runs) == {r: pytest.approx(130) for r in "abc"}  # 3 x 30 s of training fit in 100 s
    shared = [RunProfile(r, 100, 30) for r in "abc"]
    assert co_step_times(shared) == {r: pytest.approx(300) for r in "abc"}  # one rollout pool: 3 rollouts a round
    group = CoexecGroup("g", tuple(runs[:2]))
    assert group.pools == ("rollout/a", "rollout/b", "train") and group.runs_on("rollout/a") == ("a",)


def test_a_run_alone_takes_its_solo_time():
    assert co_step_times([RunProfile("a", 7, 5)]) == {"a": 12}
    with pytest.raises(ValueError, match="listed twice"):
        co_step_times([RunProfile("a", 7, 5), RunProfile("a", 1, 1)])


def test_turns_go_round_in_group_order_and_wait_for_the_turn_holder():
    turns = PhaseTurns(("a", "b", "c"))
    assert turns.next(ROLLOUT, {"a", "b", "c"}) == "a"
    turns = turns.served_by(ROLLOUT, "a")
    assert turns.next(ROLLOUT, {"c"}) is None  # b's turn: the pool waits for b
    assert turns.next(ROLLOUT, {"b", "c"}) == "b"
    turns = turns.served_by(ROLLOUT, "b").served_by(ROLLOUT, "c")
    assert turns.whose_turn(ROLLOUT) == "a" and turns.whose_turn(TRAIN) == "a"


def test_a_joining_run_goes_at_the_back_of_the_round_and_a_leaving_one_stops_blocking():
    turns = PhaseTurns(("a", "b")).served_by(ROLLOUT, "a")
    turns = turns.join("c")
    assert turns.whose_turn(ROLLOUT) == "b"  # b has not had this round's rollout yet
    turns = turns.served_by(ROLLOUT, "b")
    assert turns.whose_turn(ROLLOUT) == "a"  # a new round; c joined at the back of the last one
    turns = turns.leave("a")
    assert turns.next(ROLLOUT, {"b", "c"}) == "b" and "a" not in turns.to_dict()["served"][ROLLOUT]


def test_turns_round_trip_through_json_and_refuse_bad_input():
    turns = PhaseTurns(("a", "b")).served_by(TRAIN, "b").join("c")
    assert PhaseTurns.from_dict(json.loads(json.dumps(turns.to_dict()))) == turns
    with pytest.raises(ValueError, match="not in the group"):
        turns.served_by(ROLLOUT, "zz")
    with pytest.raises(ValueError, match="unknown pool"):
        turns.whose_turn("gpu")
    with pytest.raises(ValueError, match="listed twice"):
        PhaseTurns(("a", "a"))


def test_turns_never_stall_and_keep_runs_within_one_phase_of_each_other():
    """Random phase times drawn each step, runs joining and leaving: a pool always has a run it
    can serve, and no run gets a second phase on a pool before every other member had one."""
    rng = random.Random(7)
    for _ in range(30):
        turns, clock = PhaseTurns(), 0.0
        wants, busy_until, pool_free = {}, {}, dict.fromkeys((ROLLOUT, TRAIN), 0.0)
        names = iter(f"r{i}" for i in range(100))
        for _ in range(rng.randint(1, 4)):
            run = next(names)
            turns, wants[run], busy_until[run] = turns.join(run), ROLLOUT, 0.0
        for _ in range(200):
            if rng.random() < 0.03:
                run = next(names)
                turns, wants[run], busy_until[run] = turns.join(run), ROLLOUT, clock
            if rng.random() < 0.02 and len(wants) > 1:
                gone = rng.choice(sorted(wants))
                turns = turns.leave(gone)
                del wants[gone], busy_until[gone]
            starts = []
            for pool in (ROLLOUT, TRAIN):
                holder = turns.whose_turn(pool)
                if wants[holder] == pool:
                    starts.append((max(pool_free[pool], busy_until[holder]), pool, holder))
            assert starts, "phase turns stalled"
            start, pool, run = min(starts)
            clock = start
            counts = [turns.count(pool, r) for r in turns.order]
            assert turns.count(pool, run) == min(counts)  # no second phase before the others' first
            pool_free[pool] = busy_until[run] = start + rng.uniform(0.1, 5)
            turns = turns.served_by(pool, run)
            wants[run] = TRAIN if pool == ROLLOUT else ROLLOUT


def test_residency_names_the_run_and_the_memory():
    limits = PoolLimits(rollout_host_bytes=100 * GIB, train_host_bytes=200 * GIB)
    group = CoexecGroup("g", (RunProfile("a", 10, 10, 1 * GIB, 150 * GIB),))
    verdict = check_admission(group, RunProfile("b", 10, 10, 1 * GIB, 60 * GIB), limits)
    assert not verdict.admitted
    assert "run b" in verdict.reason and "train pool host memory 200.0 GiB" in verdict.reason
    assert "150.0 GiB parked by a" in verdict.reason and "60.0 GiB parked by b" in verdict.reason
    with pytest.raises(CoexecGroupError, match=r"run big .*rollout pool host memory 100.0 GiB < 120.0 GiB"):
        join_group([], "g", RunProfile("big", 1, 1, rollout_parked_bytes=120 * GIB), limits)


def test_a_run_that_would_break_an_slo_goes_to_a_group_of_its_own_and_says_why():
    group = CoexecGroup("g", (RunProfile("a", 10, 10, slo_factor=1.5),))
    placed = join_group([group], "g", RunProfile("b", 100, 10), ROOMY)
    assert placed.new_group and placed.group == "b"
    assert "slow run a" in placed.reason and "SLO 1.5x" in placed.reason
    fits = join_group([group], "g", RunProfile("c", 5, 5), ROOMY)
    assert fits.group == "g" and not fits.new_group and fits.reason == ""
    assert fits.step_times["a"] <= 1.5 * 20


def test_a_group_capped_in_runs_admits_no_more():
    limits = PoolLimits(1000 * GIB, 1000 * GIB, max_runs=1)
    verdict = check_admission(CoexecGroup("g", (RunProfile("a", 10, 1),)), RunProfile("b", 1, 10), limits)
    assert not verdict.admitted and "at most 1" in verdict.reason


@pytest.mark.parametrize("bad, match", [
    (lambda: RunProfile("a", 0, 1), "phase times"),
    (lambda: RunProfile("a", 1, 1, slo_factor=0.9), "slo_factor"),
    (lambda: RunProfile("a", 1, 1, train_parked_bytes=-1), "parked bytes"),
    (lambda: RunProfile("", 1, 1), "run name"),
    (lambda: RunProfile("a", 1, 1, rollout_pool="gpu0"), "rollout_pool"),
    (lambda: PoolLimits(-1, 0), "host memory"),
    (lambda: PoolLimits(0, 0, switch_s=-1), "switch_s"),
    (lambda: PoolLimits(0, 0, max_runs=0), "max_runs"),
    (lambda: CoexecGroup(""), "name"),
])
def test_bad_config_is_refused_in_one_line(bad, match):
    with pytest.raises(ValueError, match=match) as err:
        bad()
    assert "\n" not in str(err.value)


profiles = st.builds(
    RunProfile,
    run=st.just("x"),
    rollout_s=st.floats(1, 600),
    train_s=st.floats(1, 600),
    rollout_parked_bytes=st.integers(0, 60 * GIB),
    train_parked_bytes=st.integers(0, 120 * GIB),
    slo_factor=st.floats(1, 2),
    rollout_pool=st.sampled_from(["rollout", "rollout/x", "rollout/y"]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(profiles, min_size=1, max_size=8), st.floats(0, 5))
def test_admitted_groups_always_keep_every_run_within_its_slo(runs, switch_s):
    limits = PoolLimits(200 * GIB, 400 * GIB, switch_s=switch_s)
    groups: list[CoexecGroup] = []
    for i, run in enumerate(runs):
        run = RunProfile(f"r{i}", run.rollout_s, run.train_s, run.rollout_parked_bytes,
                         run.train_parked_bytes, run.slo_factor, run.rollout_pool)
        target = groups[i % len(groups)].name if groups else "g0"  # ask each group in turn
        placed = join_group(groups, target, run, limits)
        home = next((g for g in groups if g.name == placed.group), CoexecGroup(placed.group))
        groups = [g for g in groups if g.name != home.name] + [home.with_run(run)]
    for group in groups:
        times = group.step_times(limits)
        for p in group.runs:
            assert p.solo_s * (1 - 1e-9) <= times[p.run] <= p.slo_factor * p.solo_s * (1 + 1e-9)
        for pool in group.pools:
            assert group.parked_bytes(pool) <= limits.host_bytes(pool)
            # a pool serves each of its runs once a round: no run's step beats the pool's round of work
            assert min(times.values()) >= sum(p.phase_s(pool) for p in group.runs if p.uses(pool)) * (1 - 1e-9)


@settings(max_examples=80, deadline=None)
@given(st.lists(profiles, min_size=2, max_size=5))
def test_the_quick_floor_rejects_only_what_the_round_robin_would(runs):
    runs = [RunProfile(f"r{i}", p.rollout_s, p.train_s, slo_factor=p.slo_factor, rollout_pool=p.rollout_pool)
            for i, p in enumerate(runs)]
    verdict = check_admission(CoexecGroup("g", tuple(runs[:-1])), runs[-1], ROOMY)
    times = co_step_times(runs)
    within = all(times[p.run] <= p.slo_factor * p.solo_s * (1 + 1e-9) for p in runs)
    assert verdict.admitted == within


def test_fits_checks_room_only_and_a_rejoining_run_is_not_counted_twice():
    limits = PoolLimits(100 * GIB, 100 * GIB, max_runs=2)
    a = RunProfile("a", 10, 10, 60 * GIB, 0)
    group = CoexecGroup("g", (a, RunProfile("b", 500, 500)))  # b would break a's SLO: fits ignores that
    assert fits(group, RunProfile("a", 12, 12, 70 * GIB, 0), limits) == ""  # a re-measured, in place of itself
    assert "at most 2" in fits(group, RunProfile("c", 1, 1), limits)
    assert "rollout pool host memory" in fits(CoexecGroup("h", (a,)), RunProfile("c", 1, 1, 50 * GIB), limits)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(profiles, min_size=2, max_size=5), st.floats(0, 5))
def test_the_estimate_is_the_round_robin_played_long_enough(runs, switch_s):
    runs = [RunProfile(f"r{i}", p.rollout_s, p.train_s, rollout_pool=p.rollout_pool) for i, p in enumerate(runs)]
    t_co = co_step_times(runs, switch_s)
    played = play_round_robin(runs, switch_s, rounds=400)
    for r, ends in played.items():
        # each run's average step over the last 200 rounds: the steady state, the start-up ramp worn off
        # (a ramp lasts long only when a second cycle is nearly as long as the longest)
        assert (ends[-1] - ends[-201]) / 200 == pytest.approx(t_co[r], rel=0.01)


def test_a_run_leaving_never_slows_the_others():
    rng = random.Random(11)
    for _ in range(200):
        runs = [RunProfile(f"r{i}", rng.uniform(25, 600), rng.uniform(25, 600),
                           rollout_pool=rng.choice(["rollout", "rollout/x"])) for i in range(rng.randint(2, 5))]
        before = co_step_times(runs, 5.9)
        gone = rng.randrange(len(runs))
        after = co_step_times(runs[:gone] + runs[gone + 1:], 5.9)
        assert all(after[r] <= before[r] * (1 + 1e-9) for r in after)
