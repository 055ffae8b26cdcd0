import random

import pytest

from executors.policies.kv_memory import Action, KVMemoryPolicy, Lease, MemoryState


def _loaded() -> KVMemoryPolicy:
    """100 blocks, reserve 20, watermark at half the reserve; peak 30 -> budget 50, watermark 40."""
    p = KVMemoryPolicy(total_blocks=100, reserve_fraction=0.2, high_watermark=0.5, cut_factor=2)
    assert p.start_step(serving_recent_peak_blocks=30, now=0.0) == 50
    p.on_rollout_alloc("r1", 10, now=1.0, trajectory_id="t1")
    p.on_rollout_alloc("r2", 15, now=2.0, trajectory_id="t2")
    p.on_rollout_alloc("r2", 5, now=2.5)  # grows as it decodes: 20 blocks
    p.on_rollout_alloc("r3", 10, now=3.0, trajectory_id="t3")
    assert p.touch_prefix("t9", 5, now=4.0)
    return p


def test_budget_from_recent_peak_keeps_reserve():
    p = KVMemoryPolicy(total_blocks=100)
    assert p.budget == 0 and not p.can_allocate(1)  # nothing before the first RL step
    assert p.start_step(30, now=0.0) == 50  # 100 - ceil(0.2 * 100) - 30
    assert p.watermark_blocks == pytest.approx(40)  # 100 - 50 - 20 + 0.5 * 20
    assert p.start_step(90, now=1.0) == 0  # never negative
    with pytest.raises(ValueError, match="serving peak"):
        p.start_step(101, now=2.0)


def test_normal_pressure_cut_frozen_next_step():
    p = _loaded()
    assert p.rollout_used == 45 and p.state is MemoryState.NORMAL
    assert p.observe_serving(35, now=4.5) == []  # below the watermark: nothing happens
    assert p.state is MemoryState.NORMAL

    actions = p.observe_serving(40, now=5.0)  # burst reaches the watermark
    # budget 50 -> 25: 20 blocks over. The idle prefix goes first (5), then the largest
    # request r2 (20) covers the remaining 15.
    assert p.budget == 25 and p.cuts == 1 and p.last_cut_at == 5.0
    assert actions == [Action("drop_prefix", "t9", 5),
                       Action("abort", "t2", 20, request_id="r2", reroutable=True)]
    assert p.state is MemoryState.PRESSURE
    assert not p.can_allocate(0)  # nothing for rollout while the cut is carried out
    assert p.observe_serving(70, now=5.1) == []  # over the new watermark (65), but aborts are in flight
    assert p.budget == 25 and p.cuts == 1

    assert p.on_rollout_free("r2") == 20
    assert p.state is MemoryState.FROZEN and p.rollout_used == 20 <= p.budget
    assert p.on_rollout_free("r2") == 0  # abort/finish race: harmless

    p.observe_serving(5, now=6.0)  # serving calms down ...
    assert p.budget == 25 and p.state is MemoryState.FROZEN  # ... but the budget stays cut
    assert p.can_allocate(5) and not p.can_allocate(6)

    assert p.start_step(10, now=7.0) == 70  # the next RL step recomputes and unfreezes
    assert p.state is MemoryState.NORMAL and p.can_allocate(50)


def test_second_burst_in_frozen_cuts_again_youngest_of_equal_size_first():
    p = _loaded()
    p.observe_serving(40, now=5.0)
    p.on_rollout_free("r2")
    # new watermark: 100 - 25 - 20 + 10 = 65
    assert p.observe_serving(64, now=6.0) == []
    actions = p.observe_serving(65, now=6.5)
    # budget 25 -> 12; r1 and r3 hold 10 each (20 > 12): the younger r3 goes
    assert p.budget == 12 and p.cuts == 2 and p.aborted_total == 2
    assert actions == [Action("abort", "t3", 10, request_id="r3", reroutable=True)]


def test_cut_with_nothing_to_abort_goes_straight_to_frozen():
    p = KVMemoryPolicy(total_blocks=100)
    p.start_step(30, now=0.0)
    p.on_rollout_alloc("r1", 10, now=0.0)
    assert p.observe_serving(40, now=1.0) == []  # 10 blocks fit the new budget 25
    assert p.state is MemoryState.FROZEN and p.budget == 25


def test_headroom_check_refuses_rollout_when_serving_eats_into_reserve():
    p = _loaded()  # rollout 45, budget 50
    p.observe_serving(35, now=4.5)
    # 5 more blocks would fit the budget (50) but leave serving 100 - 35 - 50 = 15 < 20
    assert not p.can_allocate(5)
    assert p.can_allocate(0)  # exactly 20 free now


def test_headroom_never_violated_by_rollout_allocations_random_walk():
    rng = random.Random(7)
    p = KVMemoryPolicy(total_blocks=256, reserve_fraction=0.2, high_watermark=0.5)
    p.start_step(64, now=0.0)
    now, n, granted = 0.0, 0, 0
    live: list[str] = []
    for _ in range(3000):
        now += 0.01
        op = rng.random()
        if op < 0.3:
            serving = min(256 - p.rollout_used, max(0, p.serving_used + rng.randint(-14, 14)))
            for a in p.observe_serving(serving, now):
                if a.kind == "abort":
                    assert a.reroutable
                    p.on_rollout_free(a.request_id)
                    live.remove(a.request_id)
        elif op < 0.8:
            need = rng.randint(1, 8)
            if p.can_allocate(need):
                rid = live[rng.randrange(len(live))] if live and rng.random() < 0.6 else f"r{n}"
                if rid == f"r{n}":
                    live.append(rid)
                    n += 1
                p.on_rollout_alloc(rid, need, now)
                granted += 1
                assert p.total_blocks - p.serving_used - p.rollout_used >= p.reserve_blocks
                assert p.rollout_used <= p.budget
        elif op < 0.95 and live:
            p.on_rollout_free(live.pop(rng.randrange(len(live))))
        else:
            for lease in p.expired_leases(now):
                assert lease.expires_at <= now
            p.touch_prefix(f"t{rng.randint(0, 5)}", rng.randint(1, 6), now)
        if rng.random() < 0.01:  # a new RL step now and then
            p.start_step(p.serving_used, now)
    assert granted > 100 and p.cuts > 0  # the walk did exercise both paths


def test_lease_renew_and_expiry():
    p = KVMemoryPolicy(total_blocks=100, lease_s=10.0)
    p.start_step(0, now=0.0)
    assert p.touch_prefix("t1", 5, now=0.0)
    assert p.touch_prefix("t2", 3, now=2.0)
    assert p.expired_leases(9.99) == []
    assert p.touch_prefix("t1", 6, now=5.0)  # renewed (and grown) until 15
    assert p.prefix_blocks == 9
    assert p.expired_leases(12.0) == [Lease("t2", 3, 12.0)]
    assert p.expired_leases(12.0) == []  # reclaimed once
    assert p.expired_leases(15.0) == [Lease("t1", 6, 15.0)]
    assert p.prefix_blocks == 0 and p.rollout_used == 0


def test_lease_refused_when_it_does_not_fit_and_drop_prefix():
    p = KVMemoryPolicy(total_blocks=100)
    p.start_step(30, now=0.0)  # budget 50
    p.on_rollout_alloc("r1", 48, now=0.0)
    assert not p.touch_prefix("t1", 3, now=1.0)
    assert p.touch_prefix("t1", 2, now=1.0) and p.prefix_blocks == 2
    assert p.drop_prefix("t1") == 2 and p.drop_prefix("t1") == 0


def test_snapshot_reports_state_and_blocks():
    p = _loaded()
    p.observe_serving(40, now=5.0)
    s = p.snapshot()
    assert s["state"] == "pressure" and s["budget_blocks"] == 25 and s["cuts"] == 1
    assert s["rollout_used_blocks"] == 40 and s["rollout_prefix_blocks"] == 0
    assert s["serving_headroom_blocks"] == 100 - 40 - 40 and s["aborting"] == 1


@pytest.mark.parametrize("kwargs, msg", [
    ({"total_blocks": 0}, "total_blocks"),
    ({"total_blocks": 10, "reserve_fraction": 1.0}, "reserve_fraction"),
    ({"total_blocks": 10, "high_watermark": 1.5}, "high_watermark"),
    ({"total_blocks": 10, "cut_factor": 1}, "cut_factor"),
    ({"total_blocks": 10, "lease_s": 0}, "lease_s"),
])
def test_bad_config_rejected(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        KVMemoryPolicy(**kwargs)


def test_running_totals_match_the_held_requests_and_leases_under_random_operations():

    rng, p, now = random.Random(3), KVMemoryPolicy(total_blocks=400, lease_s=2.0), 0.0
    p.start_step(50, now)
    for _ in range(3000):
        now += rng.uniform(0, 0.2)
        op, key = rng.randrange(6), f"r{rng.randrange(12)}"
        if op == 0 and p.can_allocate(2):
            p.on_rollout_alloc(key, rng.randrange(1, 3), now)
        elif op == 1:
            p.on_rollout_free(key)
        elif op == 2:
            p.touch_prefix(f"t{rng.randrange(12)}", rng.randrange(0, 5), now)
        elif op == 3:
            p.drop_prefix(f"t{rng.randrange(12)}")
        elif op == 4:
            for lease in p.expired_leases(now):
                assert lease.expires_at <= now
        else:
            p.observe_serving(rng.randrange(0, 380), now)
        assert p.request_blocks == sum(r.blocks for r in p._requests.values())
        assert p.prefix_blocks == sum(lease.blocks for lease in p._leases.values())
        assert all(lease.expires_at > now for lease in p._leases.values()) or op != 4
