import random

import pytest

from executors.policies.router import Placement, StaleTurnError, TurnRouter, WorkerInfo


def make(rollout: int = 2, serving: int = 1, cap: int = 2, mode: str = "turnwise_affinity") -> TurnRouter:
    router = TurnRouter(cap_per_rollout_worker=cap, mode=mode)
    for i in range(rollout):
        router.register_worker(WorkerInfo(f"rollout-{i}", "rollout"))
    for i in range(serving):
        router.register_worker(WorkerInfo(f"serving-{i}", "serving"))
    return router


def place(router: TurnRouter, tid: str, admits=None) -> str | None:
    worker = router.route(tid, admits)
    if worker is not None:
        router.on_turn_start(tid, worker)
    return worker


def yes(_: str) -> bool:
    return True


def no(_: str) -> bool:
    return False


def test_bad_config_and_inputs_are_refused():
    with pytest.raises(ValueError, match="kind"):
        WorkerInfo("gpu-0", "trainer")
    with pytest.raises(ValueError, match="cap_per_rollout_worker"):
        TurnRouter(cap_per_rollout_worker=0)
    with pytest.raises(ValueError, match="mode"):
        TurnRouter(mode="sticky")
    router = make()
    with pytest.raises(ValueError, match="already registered"):
        router.register_worker(WorkerInfo("rollout-0", "serving"))
    with pytest.raises(KeyError, match="unknown worker"):
        router.on_turn_start("t0", "rollout-9")
    router.on_turn_start("t0", "rollout-0")
    with pytest.raises(ValueError, match="already has a turn"):
        router.route("t0")
    with pytest.raises(StaleTurnError):
        router.on_turn_end("t0", "rollout-1")


def test_least_loaded_then_affinity_hit():
    router = make(rollout=2, serving=0, cap=4)
    assert place(router, "a") == "rollout-0"
    assert place(router, "b") == "rollout-1"  # rollout-0 now has 1, rollout-1 has 0
    assert place(router, "c") == "rollout-0"  # tie at 1: rollout-0 has waited longest at load 1
    router.on_turn_end("b", "rollout-1")
    router.on_turn_end("c", "rollout-0")
    # loads: rollout-0 = 1 (a), rollout-1 = 0; least-loaded would say rollout-1, affinity says rollout-0
    assert router.route("c") == "rollout-0"
    p = router.on_turn_start("c", "rollout-0")
    assert p == Placement(turn=1, worker="rollout-0", kind="rollout", rerouted=False, affine=True)
    # without the affinity preference the same state goes to the least-loaded worker
    plain = make(rollout=2, serving=0, cap=4, mode="turnwise")
    for tid in "abc":
        place(plain, tid)
    plain.on_turn_end("b", "rollout-1")
    plain.on_turn_end("c", "rollout-0")
    assert plain.route("c") == "rollout-1"


def test_cap_respected_and_spill_only_when_serving_admits():
    router = make(rollout=2, serving=1, cap=2)
    for tid in "abcd":
        assert place(router, tid).startswith("rollout-")
    assert router.load("rollout-0") == router.load("rollout-1") == 2
    assert router.route("e") is None  # no admission callable: serving admits nothing
    assert router.route("e", no) is None  # full and serving declines: queue
    asked = []
    assert router.route("e", lambda n: asked.append(n) or True) == "serving-0"
    assert asked == ["serving-0"]
    place(router, "e", yes)
    assert router.placements("e")[0].kind == "serving"
    assert max(router.load(f"rollout-{i}") for i in range(2)) == 2  # cap never exceeded


def test_least_loaded_admitting_serving_worker():
    router = make(rollout=1, serving=3, cap=1)
    place(router, "r")  # fills the only rollout worker
    for tid in ("s1", "s2"):
        router.on_turn_start(tid, "serving-0")
    router.on_turn_start("s3", "serving-1")
    # loads: serving-0 = 2, serving-1 = 1, serving-2 = 0; serving-2 declines
    assert router.route("x", lambda n: n != "serving-2") == "serving-1"
    assert router.route("x", lambda n: n == "serving-0") == "serving-0"
    assert router.route("x", no) is None


def test_closed_serving_worker_is_skipped_without_asking():
    router = make(rollout=1, serving=2, cap=1)
    place(router, "r")
    router.on_turn_start("s", "serving-1")  # serving-0 is the least loaded (0 vs 1)
    router.set_admitting("serving-0", False)
    asked = []
    assert router.route("x", lambda n: asked.append(n) or True) == "serving-1"
    assert asked == ["serving-1"]  # the closed worker was not asked
    router.on_turn_end("s", "serving-1")
    router.set_admitting("serving-1", False)
    assert router.route("s", yes) is None  # affinity to a closed worker is refused too
    router.set_admitting("serving-0", True)
    router.set_admitting("serving-0", True)  # idempotent
    assert router.route("s", yes) == "serving-0"
    router.on_turn_start("s", "serving-0")
    assert router.load("serving-0") == 1
    with pytest.raises(ValueError, match="only serving workers admit"):
        router.set_admitting("rollout-0", False)


def test_serving_affinity_follows_admission():
    router = make(rollout=1, serving=2, cap=1)
    place(router, "r")
    assert place(router, "t", lambda n: n == "serving-1") == "serving-1"
    router.on_turn_end("t", "serving-1")
    # serving-0 is now the less loaded one (both 0, serving-0 longer at 0) but t's KV is on serving-1
    assert router.route("t", yes) == "serving-1"
    assert router.route("t", lambda n: n == "serving-0") == "serving-0"


def test_turnwise_moves_back_to_dedicated_when_capacity_frees():
    for mode in ("turnwise_affinity", "turnwise"):
        router = make(rollout=1, serving=1, cap=1, mode=mode)
        place(router, "a")
        assert place(router, "b", yes) == "serving-0"
        router.on_turn_end("b", "serving-0")
        # while the dedicated worker is full, affinity keeps b on the serving worker that admits
        assert router.route("b", yes) == "serving-0"
        router.on_turn_end("a", "rollout-0")  # the dedicated worker frees up
        # borrowed capacity is for the excess: b goes back even though serving-0 holds its prefix
        assert router.route("b", yes) == "rollout-0"
        p = router.on_turn_start("b", "rollout-0")
        assert (p.turn, p.kind, p.affine) == (1, "rollout", False)


def test_affinity_to_a_dedicated_worker_holds_within_its_excess_over_the_least_loaded():
    for excess in (0, 2):
        router = TurnRouter(cap_per_rollout_worker=8, affinity_max_excess=excess)
        for i in range(2):
            router.register_worker(WorkerInfo(f"rollout-{i}", "rollout"))
        assert place(router, "t") == "rollout-0"
        router.on_turn_end("t", "rollout-0")
        for k in range(4):  # other trajectories' turns land on t's worker: rollout-1 stays idle
            router.on_turn_start(f"x{k}", "rollout-0")
            held = k + 1 <= excess  # rollout-0 runs k + 1 turns more than rollout-1
            assert router.route("t") == ("rollout-0" if held else "rollout-1"), (excess, k)
    with pytest.raises(ValueError, match="affinity_max_excess"):
        TurnRouter(affinity_max_excess=-1)


def test_pinned_stays_on_first_worker_and_queues():
    pinned = make(rollout=2, serving=0, cap=1, mode="pinned")
    turnwise = make(rollout=2, serving=0, cap=1, mode="turnwise")
    for router in (pinned, turnwise):
        assert place(router, "a") == "rollout-0"
        assert place(router, "b") == "rollout-1"
        router.on_turn_end("a", "rollout-0")
        assert place(router, "c") == "rollout-0"  # c takes a's slot while a is between turns
        router.on_turn_end("b", "rollout-1")
    # a's home is full: pinned waits for it, turn-wise moves a to the free worker
    assert pinned.route("a") is None
    assert turnwise.route("a") == "rollout-1"
    pinned.on_turn_end("c", "rollout-0")
    assert pinned.route("a") == "rollout-0"


def test_dead_worker_returns_its_turns_and_is_avoided():
    router = make(rollout=2, serving=0, cap=4)
    for tid in "abc":
        router.on_turn_start(tid, "rollout-0")
    router.on_turn_start("d", "rollout-1")
    assert router.remove_worker("rollout-0") == ["a", "b", "c"]
    assert [w.name for w in router.workers()] == ["rollout-1"]
    with pytest.raises(StaleTurnError):
        router.on_turn_end("a", "rollout-0")  # a late result from the dead worker
    assert router.route("a") == "rollout-1"
    p = router.on_turn_start("a", "rollout-1")
    assert (p.turn, p.rerouted, p.affine) == (0, True, False)
    # a restarted worker under the same name is a new incarnation: no affinity to it
    router.register_worker(WorkerInfo("rollout-0", "rollout"))
    router.on_turn_start("b", "rollout-0")
    assert router.placements("b")[-1].affine is False and router.placements("b")[-1].rerouted
    with pytest.raises(KeyError):
        router.remove_worker("rollout-7")


def test_pinned_trajectory_repins_after_its_worker_dies():
    router = make(rollout=2, serving=0, cap=2, mode="pinned")
    place(router, "a")
    router.on_turn_end("a", "rollout-0")
    router.remove_worker("rollout-0")
    assert router.route("a") == "rollout-1"
    router.on_turn_start("a", "rollout-1")
    router.on_turn_end("a", "rollout-1")
    router.on_turn_start("z", "rollout-1")
    router.register_worker(WorkerInfo("rollout-2", "rollout"))  # emptier, but a is pinned now
    assert router.route("a") == "rollout-1"
    assert router.route("y") == "rollout-2"


def test_aborted_turn_is_rerouted_and_affinity_lapses():
    router = make(rollout=1, serving=1, cap=1)
    place(router, "r")
    place(router, "t", yes)
    router.on_turn_end("t", "serving-0")
    place(router, "t", yes)
    router.on_turn_aborted("t", "serving-0")  # emergency KV cut on the serving GPU
    assert router.load("serving-0") == 0
    p = router.on_turn_start("t", "serving-0")
    assert (p.turn, p.rerouted, p.affine) == (1, True, False)


def test_forget_frees_the_slot_and_returns_placements():
    router = make(rollout=1, serving=0, cap=1)
    place(router, "a")
    assert router.route("b") is None
    placements = router.forget("a")  # aborted as surplus mid-turn
    assert [p.worker for p in placements] == ["rollout-0"]
    assert router.load("rollout-0") == 0 and router.route("b") == "rollout-0"
    with pytest.raises(KeyError):
        router.placements("a")


def test_random_workload_keeps_loads_exact_and_bounded():
    rng = random.Random(7)
    router = make(rollout=4, serving=3, cap=3)
    running: dict[str, str] = {}
    closed: set[str] = set()
    dead = 0
    for step in range(4000):
        tid = f"t{rng.randrange(40)}"
        action = rng.random()
        if tid in running and action < 0.6:
            router.on_turn_end(tid, running.pop(tid))
        elif tid in running and action < 0.65:
            router.forget(tid)
            running.pop(tid)
        elif tid not in running:
            flags = {w.name: rng.random() < 0.5 for w in router.workers()}
            worker = router.route(tid, flags.get)
            if worker is not None and worker.startswith("serving"):
                assert flags[worker] and worker not in closed  # only an open, admitting worker
            if worker is not None:
                router.on_turn_start(tid, worker)
                running[tid] = worker
        if step % 50 == 0:  # a co-serving executor opens or closes its admission
            serving = [w.name for w in router.workers() if w.kind == "serving"]
            name, admitting = rng.choice(serving), rng.random() < 0.5
            router.set_admitting(name, admitting)
            (closed.discard if admitting else closed.add)(name)
        if step % 500 == 499:  # kill a worker, then bring a fresh one up
            victim = rng.choice(router.workers())
            lost = router.remove_worker(victim.name)
            assert sorted(lost) == sorted(t for t, w in running.items() if w == victim.name)
            for t in lost:
                running.pop(t)
            dead += 1
            router.register_worker(WorkerInfo(f"{victim.kind}-new{dead}", victim.kind))
        for w in router.workers():
            load = router.load(w.name)
            assert load == sum(1 for v in running.values() if v == w.name) >= 0
            if w.kind == "rollout":
                assert load <= 3


def test_no_affinity_to_a_restarted_worker_of_the_same_name():
    router = make(rollout=2, serving=0, cap=4)
    router.on_turn_start("e", "rollout-0")
    router.on_turn_end("e", "rollout-0")
    assert router.remove_worker("rollout-0") == []
    router.register_worker(WorkerInfo("rollout-0", "rollout"))  # restarted: its prefix cache is empty
    for tid in ("z1", "z2"):
        router.on_turn_start(tid, "rollout-0")
    assert router.route("e") == "rollout-1"  # plain least-loaded, not the dead incarnation's name
    assert router.on_turn_start("e", "rollout-0").affine is False
