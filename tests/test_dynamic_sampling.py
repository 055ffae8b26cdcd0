import pytest

from executors.policies.dynamic_sampling import DynamicSampler, counts

ZERO_VAR = [1.0, 1.0, 1.0]
SPREAD = [0.0, 1.0, 1.0]


def launch(s: DynamicSampler, start: int) -> list[int]:
    ids = list(range(start, start + s.to_launch()))
    for gid in ids:
        s.on_group_launched(gid)
    return ids


def test_a_group_counts_only_with_reward_variance():
    assert counts([0.0, 1.0])
    assert not counts([0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="at least 2"):
        counts([1.0])
    with pytest.raises(ValueError, match="NaN"):
        counts([1.0, float("nan")])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="initial_launch"):
        DynamicSampler(target_groups=4, initial_launch=3)
    with pytest.raises(ValueError, match="target_groups"):
        DynamicSampler(target_groups=0, initial_launch=3)
    with pytest.raises(ValueError, match="max_launch"):
        DynamicSampler(target_groups=2, initial_launch=4, max_launch=3)
    s = DynamicSampler(target_groups=1, initial_launch=1)
    with pytest.raises(ValueError, match="not in flight"):
        s.on_group_done(5, SPREAD)


def test_initial_launch_then_top_up_from_observed_keep_rate():
    s = DynamicSampler(target_groups=2, initial_launch=4)  # prior keep rate 0.5
    assert launch(s, 0) == [0, 1, 2, 3]
    assert not s.should_launch_more()  # 4 in flight x 0.5 expected = 2 = target
    assert s.on_group_done(0, ZERO_VAR) is False
    assert s.on_group_done(1, SPREAD) is True
    # rate = (1 + 2*0.5) / (2 + 2) = 0.5; shortfall = 2 - 1 - 0.5*2 = 0
    assert s.keep_rate == pytest.approx(0.5)
    assert s.to_launch() == 0
    s.on_group_done(2, ZERO_VAR)
    # rate = (1 + 1) / (3 + 2) = 0.4; shortfall = 2 - 1 - 0.4*1 = 0.6 -> ceil(0.6 / 0.4) = 2
    assert s.keep_rate == pytest.approx(0.4)
    assert s.to_launch() == 2
    assert launch(s, 4) == [4, 5]
    assert s.surplus_to_abort() == []  # target not reached: nothing is surplus yet
    s.on_group_done(5, SPREAD)
    assert s.target_reached and not s.should_launch_more()
    assert s.surplus_to_abort() == [3, 4]
    for gid in s.surplus_to_abort():
        s.on_group_aborted(gid)
    assert s.surplus_to_abort() == []
    assert s.batch() == [1, 5]
    # observed rate (2 + 1) / (4 + 2) = 0.5 -> next step launches ceil(2 / 0.5) = 4
    assert s.next_step_launch() == 4
    assert s.summary()["aborted"] == 2


def test_next_step_launch_follows_the_keep_rate_within_bounds():
    low = DynamicSampler(target_groups=2, initial_launch=2, max_launch=20)
    launch(low, 0)
    for gid in range(2):
        low.on_group_done(gid, ZERO_VAR)
    # rate = (0 + 2*1.0) / (2 + 2) = 0.5 -> ceil(2 / 0.5) = 4 up front next step
    assert low.next_step_launch() == 4
    high = DynamicSampler(target_groups=3, initial_launch=6)
    launch(high, 0)
    for gid in range(6):
        high.on_group_done(gid, SPREAD)
    # rate = (6 + 2*0.5) / (6 + 2) = 0.875 -> ceil(3 / 0.875) = 4, never below the target
    assert high.next_step_launch() == 4
    capped = DynamicSampler(target_groups=4, initial_launch=4, max_launch=6)
    launch(capped, 0)
    for gid in range(4):
        capped.on_group_done(gid, ZERO_VAR)
    assert capped.next_step_launch() == 6  # ceil(4 / (2/6)) = 12, clamped to max_launch


def test_launch_budget_bounds_a_step_that_never_finds_variance():
    s = DynamicSampler(target_groups=2, initial_launch=2, max_launch=5)
    gid = 0
    while s.should_launch_more():
        for g in launch(s, gid):
            s.on_group_done(g, ZERO_VAR)
        gid += 5
    assert s.summary()["launched"] == 5
    assert s.exhausted and s.batch() == []
    with pytest.raises(ValueError, match="budget"):
        s.on_group_launched(99)
