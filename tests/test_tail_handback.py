"""Tail hand-back (executors/policies/tail_handback.py): the policy by hand, the scheduler over
a real in-process Dask cluster, and the cluster simulator that drives the same object."""
from __future__ import annotations

import time

import pytest
from distributed import WorkerPlugin, get_worker

from executors.policies.tail_handback import HandbackConfig, TailHandback
from core.config import SchedulerConfig
from executors.turns import TurnResult
from sim.cluster import ClusterSim
from sim.config import SimConfig
from tests.test_rollout_scheduler import cluster, enc, episodes, fake_generate, scheduler  # noqa: F401


def test_nothing_is_due_before_a_dedicated_turn_sets_the_pace():
    hb = TailHandback()
    assert hb.due({"a": 0.0}, free_dedicated_slots=4, queued=0, now=100.0) == []
    assert hb.threshold_s() is None


def test_due_turns_are_the_oldest_past_the_threshold_up_to_the_free_slots():
    hb = TailHandback(HandbackConfig(factor=4.0, min_wait_s=0.0))
    for s in (0.1, 0.1, 0.3):
        hb.on_dedicated_turn(s)
    assert hb.threshold_s() == pytest.approx(0.4)  # 4 x the median
    borrowed = {"new": 9.9, "old": 9.0, "older": 8.0, "oldest": 7.0}
    assert hb.due(borrowed, free_dedicated_slots=1, queued=3, now=10.0) == []  # the queue goes first
    assert hb.due(borrowed, free_dedicated_slots=0, queued=0, now=10.0) == []
    assert hb.due(borrowed, free_dedicated_slots=2, queued=0, now=10.0) == ["oldest", "older"]
    assert hb.handed_back("oldest") and not hb.handed_back("old")
    # each turn at most once; "new" (0.1 s out) is not due yet
    assert hb.due(borrowed, free_dedicated_slots=5, queued=0, now=10.0) == ["old"]
    assert hb.due(borrowed, free_dedicated_slots=5, queued=0, now=9.9 + 0.4) == ["new"]  # due in time


def test_the_threshold_never_falls_below_the_floor_and_bad_settings_are_refused():
    hb = TailHandback(HandbackConfig(factor=2.0, min_wait_s=0.5))
    hb.on_dedicated_turn(0.01)
    assert hb.threshold_s() == 0.5
    with pytest.raises(ValueError, match="factor"):
        HandbackConfig(factor=0.5)
    with pytest.raises(ValueError, match="handback|factor"):
        SchedulerConfig(handback_factor=0.5)
    assert SchedulerConfig(handback_factor=0).handback_factor == 0  # off


class HeldAborts(WorkerPlugin):
    """Stands in for the co-serving executor's plugin: an out-of-band abort releases the turn."""

    def __init__(self):
        self.aborted: set[str] = set()

    def abort(self, request_ids):
        self.aborted.update(request_ids)


def serving_holds_until_aborted(requests):
    """The serving worker sits on its turns (a serving burst) until the scheduler aborts them."""
    if not get_worker().name.startswith("serving"):
        return fake_generate(requests)
    plugin = get_worker().plugins["rose-coserving"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(r.request_id in plugin.aborted for r in requests):
        time.sleep(0.01)
    return [TurnResult(r.request_id, r.trajectory_id, [], [], "abort", get_worker().name, "serving")
            for r in requests]


def test_scheduler_takes_held_borrowed_turns_back_for_an_idle_dedicated_worker(cluster):  # noqa: F811
    c, client = cluster
    client.register_plugin(HeldAborts(), name="rose-coserving")
    workers = {"rollout-0": "rollout", "serving-0": "serving"}
    sched = scheduler(client, workers, cap_per_worker=1, admits=lambda n: True)
    sched.generate = serving_holds_until_aborted
    report = sched.run(episodes(1, 3))  # one trajectory fits rollout-0; two spill and are held
    assert report.handed_back == 2 and sorted(report.interrupted) == ["serving-0"]
    aborted = c.workers["serving-0"].plugins["rose-coserving"].aborted
    assert len(aborted) == 2
    assert {r["worker"] for r in report.rows} == {"rollout-0"}  # every turn finished at home
    assert len(report.episodes) == 3 and all(ep.done for ep in report.episodes)
    assert report.seconds < 30  # not the serving worker's hold: they came back


def test_the_simulator_hands_back_through_the_same_policy(monkeypatch):
    cfg = SimConfig(gpus=8, steps=2, traj_per_rollout_gpu=24, serving_rate=40.0)
    calls = []
    real = TailHandback.due

    def spy(self, *a, **kw):
        chosen = real(self, *a, **kw)
        calls.append(len(chosen))
        return chosen

    monkeypatch.setattr(TailHandback, "due", spy)
    on = ClusterSim(cfg).run()
    assert calls and sum(calls) == on["turns_handed_back"]
    off = ClusterSim(SimConfig(**{**cfg.__dict__, "tail_handback": False})).run()
    assert off["turns_handed_back"] == 0
    assert on["trajectories_finished"] == on["trajectories_started"]  # nothing lost on the way


def test_run_config_refuses_a_factor_that_would_hand_back_turns_before_they_could_finish():
    from pydantic import ValidationError

    from core.config import RolloutConfig

    with pytest.raises(ValidationError, match="handback_factor"):
        RolloutConfig(handback_factor=0.5)
    assert RolloutConfig(handback_factor=0).handback_factor == 0


def test_pinned_trajectories_are_never_handed_back():
    cfg = SimConfig(gpus=8, steps=1, traj_per_rollout_gpu=24, serving_rate=40.0, mode="pinned")
    assert ClusterSim(cfg).run()["turns_handed_back"] == 0
    assert ClusterSim(SimConfig(**{**cfg.__dict__, "mode": "turnwise_affinity"})).run()["turns_handed_back"] > 0
