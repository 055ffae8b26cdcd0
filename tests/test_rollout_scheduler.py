"""The dispatch loop over a real (in-process) Dask cluster with named workers and a fake engine.

The fake engine answers every turn at once (or hangs, or answers "stale", per worker), and a
fake environment ends each trajectory after TURNS turns, rewarding the reply "win" on the last:
enough to check routing, rerouting, exclusion, rejoin and dynamic sampling by hand.
"""
from __future__ import annotations

import threading
import time

import pytest
from distributed import Client, Scheduler, SpecCluster, Worker, WorkerPlugin, get_worker

from envs.base import MultiTurnEnv, StepResult
from executors.policies.dynamic_sampling import DynamicSampler
from executors.scheduling.episode import Episode
from executors.scheduling.group_launch import GroupLauncher
from executors.scheduling.scheduler import RolloutScheduler, RolloutStuck
from executors.scheduling.admission_view import ServingAdmission
from executors.turns import TurnResult
from executors.scheduling.liveness import WorkerLiveness
from tasks.reward import advantages_by_trajectory

TURNS = 3
BEHAVIOUR: dict[str, str] = {}  # worker -> "ok" | "stale" | "hang"; in-process workers share it
RELEASE = threading.Event()
WINNERS: set[str] = set()  # trajectory ids that reply "win"
ADMITTING = {"serving-0": False}


def enc(text: str) -> list[int]:
    return [ord(c) for c in text]


class FakeChat:
    eos_id = 2

    def system(self, text):
        return [1] + enc(text) + [2]

    def user_turn(self, text):
        return [1] + enc(text) + [2, 3]

    def close_reply(self, ids):
        return ([] if ids and ids[-1] == 2 else [2]) + [10]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i >= 32)


class CoinEnv(MultiTurnEnv):
    name = "coin"
    system_prompt = "play"

    def reset(self, seed):
        self._begin()
        return f"seed {seed}"

    def step(self, reply):
        self._check_running()
        self.turn += 1
        if self.turn >= TURNS:
            self.done = True
            win = "win" in reply
            return StepResult("over", 1.0 if win else 0.0, True, {"success": win, "valid_action": True})
        return StepResult(f"turn {self.turn}", 0.0, False, {"valid_action": True})

    def expert_reply(self):
        return "win"


def fake_generate(requests):
    name = get_worker().name
    if BEHAVIOUR.get(name) == "hang":
        RELEASE.wait(30)
        raise RuntimeError("engine gone")
    out = []
    for r in requests:
        if BEHAVIOUR.get(name) == "stale" or (BEHAVIOUR.get(name) == "v0"
                                                and r.min_policy_version > 0):
            out.append(TurnResult(r.request_id, r.trajectory_id, [], [], "stale", name, "rollout"))
            continue
        ids = enc("win" if r.trajectory_id in WINNERS else "lose") + [2]
        kind = "serving" if name.startswith("serving") else "rollout"
        out.append(TurnResult(r.request_id, r.trajectory_id, ids, [-0.5] * len(ids), "stop", name,
                              kind, 0, len(r.prompt_ids), 0, 0.001, 0.002, 0.003))
    time.sleep(0.02)
    return out


def fake_state():
    return {"admitting": ADMITTING[get_worker().name]}


def heal():
    BEHAVIOUR[get_worker().name] = "ok"
    return True


def episode(group: int, i: int, step: int = 1) -> Episode:
    return Episode(run="t", step=step, group=group, trajectory_id=f"s{step}-g{group}-t{i}",
                   env=CoinEnv(), env_seed=group, chat=FakeChat(), max_turns=8, max_tokens=4,
                   temperature=1.0, top_p=1.0, min_policy_version=step - 1)


def episodes(groups: int, size: int) -> list[Episode]:
    return [episode(g, i) for g in range(groups) for i in range(size)]


@pytest.fixture
def cluster():
    names = ["rollout-0", "rollout-1", "serving-0"]
    spec = {n: {"cls": Worker, "options": {"name": n, "nthreads": 2, "dashboard": False}}
            for n in names}
    BEHAVIOUR.clear(), WINNERS.clear(), RELEASE.clear()
    ADMITTING["serving-0"] = False
    with SpecCluster(workers=spec, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                     asynchronous=False) as c, Client(c) as client:
        yield c, client
    RELEASE.set()


def scheduler(client, workers, **kw) -> RolloutScheduler:
    kw.setdefault("cap_per_worker", 2)
    return RolloutScheduler(client, workers, generate=fake_generate, heartbeat_s=0.1, **kw)


TWO = {"rollout-0": "rollout", "rollout-1": "rollout"}


def test_every_turn_runs_and_is_recorded_with_placement(cluster):
    _, client = cluster
    report = scheduler(client, TWO).run(episodes(3, 4))
    rows = report.rows
    assert len(report.episodes) == 12 and len(rows) == 12 * TURNS
    assert {r["worker"] for r in rows} == {"rollout-0", "rollout-1"}
    assert {r["status"] for r in rows} == {"ok"} and report.rerouted_turns == 0
    # 12 trajectories over 2 workers capped at 2: most turns wait in the scheduler's queue,
    # and that wait is in queued_s on top of the engine's 1 ms
    assert all(r["queued_s"] >= 0.001 for r in rows)
    assert max(r["queued_s"] for r in rows) > 0.02


def test_turns_of_a_dead_worker_are_rerouted_with_history_intact(cluster):
    c, client = cluster
    BEHAVIOUR["rollout-1"] = "hang"
    sched = scheduler(client, TWO)
    victims: list[str] = []

    def kill_after_first_turn(row):
        if not victims:
            victims.extend(sched.router._workers["rollout-1"].in_flight)
            c.sync(c.workers["rollout-1"].close, executor_wait=False)

    report = sched.run(episodes(2, 3), on_turn=kill_after_first_turn)
    RELEASE.set()
    assert victims and report.dead_workers == ["rollout-1"]
    assert len(report.episodes) == 6 and all(ep.done for ep in report.episodes)
    rerouted = [r for r in report.rows if r["status"] == "rerouted"]
    assert {r["trajectory"] for r in rerouted} == set(victims)
    assert all(r["worker"] == "rollout-0" and r["turn"] == 0 for r in rerouted)
    for ep in report.episodes:  # each turn's prompt extends the previous one: history intact
        for a, b in zip(ep.rows, ep.rows[1:]):
            assert b["prompt_ids"][: len(a["prompt_ids"])] == a["prompt_ids"]
        assert [r["turn"] for r in ep.rows] == list(range(TURNS))


def test_a_stale_worker_is_excluded_not_retried_forever(cluster):
    _, client = cluster
    BEHAVIOUR["rollout-1"] = "stale"
    report = scheduler(client, TWO).run(episodes(2, 4))
    assert report.excluded_workers == ["rollout-1"] and not report.rejoined_workers
    assert {r["worker"] for r in report.rows} == {"rollout-0"}
    assert len(report.rows) == 8 * TURNS
    assert any(r["status"] == "rerouted" for r in report.rows)


def test_a_stale_worker_rejoins_after_a_weight_sync(cluster):
    _, client = cluster
    BEHAVIOUR["rollout-1"] = "stale"
    synced = []

    def resync(name, kind):
        synced.append((name, kind))
        return client.submit(heal, workers=[name], allow_other_workers=False, pure=False)

    report = scheduler(client, TWO, cap_per_worker=1, resync=resync).run(episodes(4, 4))
    assert synced == [("rollout-1", "rollout")] and report.rejoined_workers == ["rollout-1"]
    assert "rollout-1" in {r["worker"] for r in report.rows}  # served turns after rejoining
    assert len(report.rows) == 16 * TURNS


def test_no_worker_left_is_an_error_not_a_hang(cluster):
    _, client = cluster
    BEHAVIOUR["rollout-0"] = "stale"
    with pytest.raises(RolloutStuck, match="no worker is left"):
        scheduler(client, {"rollout-0": "rollout"}).run(episodes(1, 2))


def test_excess_turns_spill_to_an_admitting_serving_worker(cluster):
    _, client = cluster
    workers = {"rollout-0": "rollout", "serving-0": "serving"}
    alone = scheduler(client, workers, cap_per_worker=1, admits=lambda n: False).run(episodes(1, 4))
    assert {r["worker_kind"] for r in alone.rows} == {"rollout"}
    lent = scheduler(client, workers, cap_per_worker=1, admits=lambda n: True).run(episodes(1, 4))
    assert {r["worker_kind"] for r in lent.rows} == {"rollout", "serving"}


def test_a_serving_worker_still_pulling_serves_within_the_staleness_bound(cluster):
    _, client = cluster
    BEHAVIOUR["serving-0"] = "v0"  # its pull of v1 has not finished: it runs v0
    workers = {"rollout-0": "rollout", "serving-0": "serving"}
    step2 = [episode(0, i, step=2) for i in range(4)]  # rolled out with v1
    lagging = scheduler(client, workers, cap_per_worker=1, admits=lambda n: True,
                        serving_lag=1).run(step2)
    assert "serving-0" in {r["worker"] for r in lagging.rows} and not lagging.excluded_workers
    strict = scheduler(client, workers, cap_per_worker=1, admits=lambda n: True,
                       serving_lag=0).run([episode(1, i, step=2) for i in range(4)])
    assert strict.excluded_workers == ["serving-0"]
    assert {r["worker"] for r in strict.rows} == {"rollout-0"}


def test_serving_admission_is_a_cached_flag_refreshed_by_polls(cluster):
    _, client = cluster
    load = {"serving-0": 0}
    adm = ServingAdmission(client, ["serving-0"], load.__getitem__, max_turns=2, refresh_s=0.05,
                           state_fn=fake_state)
    assert not adm.admits("serving-0")  # no answer yet: serving first
    ADMITTING["serving-0"] = True
    deadline = time.monotonic() + 10
    while not adm.admits("serving-0") and time.monotonic() < deadline:
        adm.refresh()
        time.sleep(0.02)
    assert adm.admits("serving-0")
    load["serving-0"] = 2  # bound on rollout turns queued there
    assert not adm.admits("serving-0")
    load["serving-0"] = 0
    adm.on_abort("serving-0")  # a KV cut closes the gate before the next poll
    assert not adm.admits("serving-0")
    adm.close()


class AbortRecorder(WorkerPlugin):
    """Stands in for the rollout engine's plugin: records out-of-band aborts."""

    name = "rose-rollout"

    def __init__(self):
        self.aborted: list[str] = []

    def abort(self, request_ids):
        self.aborted.extend(request_ids)


def test_dynamic_sampling_keeps_only_varied_groups_and_aborts_the_surplus(cluster):
    c, client = cluster
    client.register_plugin(AbortRecorder(), name="rose-rollout")
    for g in range(20):  # groups 0, 3, 6, ... never vary; the others have one winner
        if g % 3:
            WINNERS.add(f"s1-g{g}-t0")
    sampler = DynamicSampler(target_groups=3, initial_launch=4, max_launch=12)
    launcher = GroupLauncher(lambda g: [episode(g, i) for i in range(3)], 3, sampler)
    report = scheduler(client, TWO, cap_per_worker=3).run(launcher)
    kept = {ep.group for ep in report.episodes}
    assert len(kept) == 3 and all(g % 3 for g in kept)
    assert all(ep.done for ep in report.episodes) and len(report.episodes) == 9
    s = report.sampling
    assert s["groups_varied"] >= 3 and s["groups_zero_variance"] >= 1
    assert s["groups_launched"] > 4  # group 0 failed, so it topped up
    assert s["groups_launched"] == s["groups_varied"] + s["groups_zero_variance"] + s["groups_aborted"]
    adv = advantages_by_trajectory(report.rows)  # the reward task accepts the kept groups
    assert len(adv) == 9
    aborted = [rid for n in TWO for rid in c.workers[n].plugins["rose-rollout"].aborted]
    assert len(aborted) == report.aborted_turns  # the surplus in flight, aborted in the engines
    assert not {int(rid.split("-g")[1].split("-")[0]) for rid in aborted} & kept


def test_group_launcher_fills_up_with_zero_variance_groups_when_budget_runs_out():
    sampler = DynamicSampler(target_groups=2, initial_launch=2, max_launch=3)
    launcher = GroupLauncher(lambda g: [episode(g, i) for i in range(2)], 2, sampler)
    eps = launcher.launch()
    assert [e.group for e in eps] == [0, 0, 1, 1]
    for e in eps:  # every trajectory finishes with reward 0: no group varies
        e.rows = [{"trajectory_reward": 0.0}]
        assert launcher.on_trajectory_done(e) == []
    more = launcher.launch()
    assert [e.group for e in more] == [2, 2]
    for e in more:
        e.rows = [{"trajectory_reward": 0.0}]
        launcher.on_trajectory_done(e)
    assert launcher.launch() == [] and sampler.exhausted
    assert launcher.kept_groups() == [0, 1]  # first finished, to keep the batch's shape


class FakeSchedulerClient:
    def __init__(self):
        self.workers = {"tcp://a:1": {"name": "rollout-0"}, "tcp://b:1": {"name": "rollout-1"}}

    def scheduler_info(self, n_workers=-1):
        return {"workers": self.workers}


def test_liveness_tells_lost_and_returned_incarnations_apart():
    client = FakeSchedulerClient()
    live = WorkerLiveness(client, ["rollout-0", "rollout-1"], every_s=60)
    assert live.poll().lost == []  # between checks nothing is asked
    del client.workers["tcp://b:1"]
    ev = live.poll(force=True)
    assert ev.lost == ["rollout-1"] and ev.returned == [] and live.address("rollout-1") is None
    client.workers["tcp://b:2"] = {"name": "rollout-1"}  # the nanny restarted it
    ev = live.poll(force=True)
    assert ev.lost == [] and ev.returned == ["rollout-1"] and live.address("rollout-1") == "tcp://b:2"
    client.workers["tcp://a:9"] = client.workers.pop("tcp://a:1")  # restarted before we looked
    ev = live.poll(force=True)
    assert ev.lost == ["rollout-0"] and ev.returned == ["rollout-0"]
    with pytest.raises(RuntimeError, match="not connected"):
        WorkerLiveness(client, ["serving-9"])


def test_a_freed_slot_goes_to_the_trajectory_whose_prefix_is_there():
    from collections import deque

    client = FakeSchedulerClient()
    sched = RolloutScheduler(client, TWO, cap_per_worker=1, generate=fake_generate)
    router = sched.router
    router.on_turn_start("t", "rollout-0")  # t just finished a turn on rollout-0 ...
    router.on_turn_end("t", "rollout-0")
    router.on_turn_start("x", "rollout-1")  # ... rollout-1 is busy, "old" has waited longest
    sched.last_worker = {"t": "rollout-0"}
    sched.ready = deque(["old", "t"])
    batches: dict = {}
    sched.ready = sched._place(batches, affine_only=True)
    sched.ready = sched._place(batches, affine_only=False)
    assert batches == {"rollout-0": ["t"]} and list(sched.ready) == ["old"]
    # plain FIFO (what turnwise routing does) would hand the slot to "old": t re-prefills later
    router.on_turn_end("t", "rollout-0")
    sched.ready, batches = deque(["old", "t"]), {}
    sched.ready = sched._place(batches, affine_only=False)
    assert batches == {"rollout-0": ["old"]} and list(sched.ready) == ["t"]


def test_dynamic_sampling_config_and_the_persisted_launch_target(tmp_path, monkeypatch):
    import tasks.rollout as rollout_task
    from core.config import RolloutConfig, RunConfig

    with pytest.raises(ValueError, match="dynamic_sampling_max_launch"):
        RolloutConfig(dynamic_sampling_oversample=3.0, dynamic_sampling_max_launch=2.0)
    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(rollout_task, "group_factory",
                        lambda cfg, step, version, hosts=None: lambda g: [episode(g, i, step) for i in range(2)])
    cfg = RunConfig(run_id="ds", rollout=RolloutConfig(
        groups=4, group_size=2, dynamic_sampling=True, dynamic_sampling_oversample=1.5,
        dynamic_sampling_max_launch=2.0))
    first = rollout_task.group_launcher(cfg, 1, 0).sampler
    assert (first.initial_launch, first.max_launch) == (6, 8)  # ceil(4 * 1.5), ceil(4 * 2.0)
    for wanted, got in ((5, 5), (20, 8), (1, 4)):  # next step's target, clamped to [4, 8]
        rollout_task.save_sampling(cfg, 1, {"next_step_launch": wanted})
        assert rollout_task.group_launcher(cfg, 2, 1).sampler.initial_launch == got
    plain = RunConfig(run_id="ds", rollout=RolloutConfig(groups=4, group_size=2))
    assert rollout_task.group_launcher(plain, 1, 0).sampler is None


def test_a_hung_but_live_worker_fails_its_health_check(cluster):
    _, client = cluster
    BEHAVIOUR["rollout-1"] = "hang"  # alive for Dask, but its engine never answers
    report = scheduler(client, TWO, turn_timeout_s=0.5).run(episodes(2, 3))
    RELEASE.set()
    assert report.excluded_workers == ["rollout-1"] and not report.dead_workers
    assert len(report.rows) == 6 * TURNS and {r["worker"] for r in report.rows} == {"rollout-0"}
    assert {r["status"] for r in report.rows} == {"ok", "rerouted"}


def test_a_worker_dying_with_finished_results_costs_a_reroute_not_a_hang(cluster, monkeypatch):
    """rollout-1 finishes a batch and dies before the scheduler fetched the results: Dask then
    recomputes the batch on the dead address, so an unbounded fetch waited forever (chaos
    bench fault 3: serving-0 killed while lent)."""
    import executors.scheduling.scheduler as sched_mod

    c, client = cluster
    sched = scheduler(client, TWO, result_timeout_s=1.0)
    real_wait, killed = sched_mod.wait, []

    def wait_then_kill(futures, **kw):
        done, rest = real_wait(futures, **kw)
        if not killed and any(sched.inflight.get(f, ("",))[0] == "rollout-1" for f in done):
            killed.append(True)  # its results are in its memory only, not fetched yet
            c.sync(c.workers["rollout-1"].close, executor_wait=False)
        return done, rest

    monkeypatch.setattr(sched_mod, "wait", wait_then_kill)
    out: list = []
    runner = threading.Thread(target=lambda: out.append(sched.run(episodes(2, 3))), daemon=True)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the rollout hung on a dead worker's results"
    [report] = out
    assert killed and report.dead_workers == ["rollout-1"]
    assert len(report.episodes) == 6 and all(ep.done for ep in report.episodes)
    assert report.rerouted_turns > 0


def test_scheduler_config_is_validated_once():
    from core.config import SchedulerConfig

    with pytest.raises(ValueError, match="turn_timeout_s\n  Input should be greater than 0"):
        SchedulerConfig(turn_timeout_s=0)
    with pytest.raises(ValueError, match="routing\n  Input should be 'turnwise_affinity'"):
        SchedulerConfig(routing="random")
    with pytest.raises(ValueError, match="max_concurrency_per_worker\n  Input should be greater"):
        SchedulerConfig(max_concurrency_per_worker=0)
