"""The one-step off-policy pipeline's ordering (flows/pipeline.py), without Prefect or a stack.

A fake step runs rl_step's phases in rl_step's order through the same gates (`_gate`), with a
trainer whose version is the number of updates: each turn's policy version and the trainer's
version at the update are recorded, so the bound and the overlap are checked on real timings.
"""
from __future__ import annotations

import threading
import time

import pytest

from flows.pipeline import PipelineStopped, active_gates, rollout_version, run_pipelined
from flows.rl_step import _gate, serving_lag_cfg
from core.config import RunConfig


class FakeRun:
    def __init__(self, rollout_s: float, train_s: float, fail_train: int | None = None) -> None:
        self.rollout_s, self.train_s, self.fail_train = rollout_s, train_s, fail_train
        self.trainer_version = 0
        self.published = 0  # version the rollout workers hold
        self.log: list[tuple[str, int, float]] = []  # (event, step, time)
        self.turn_versions: dict[int, int] = {}  # step -> version its turns were sampled with
        self.lag_at_train: dict[int, int] = {}  # step -> trainer version - turn version
        self.lock = threading.Lock()

    def note(self, event: str, step: int) -> None:
        with self.lock:
            self.log.append((event, step, time.perf_counter()))

    def step(self, cfg: RunConfig, step: int) -> dict:
        gates = active_gates(cfg.run_id)
        floor = rollout_version(step, cfg.max_staleness)
        assert self.published >= floor  # the version it rolls out with is on the workers
        self.note("rollout_start", step)
        self.turn_versions[step] = self.published  # workers run the newest version they hold
        time.sleep(self.rollout_s)
        self.note("rollout_end", step)
        _gate(gates, "rolled", step, then_wait=("trained", step - 1))
        assert self.trainer_version == step - 1
        self.note("train_start", step)
        self.lag_at_train[step] = self.trainer_version - self.turn_versions[step]
        time.sleep(self.train_s)
        if step == self.fail_train:
            raise RuntimeError(f"train {step} failed")
        self.trainer_version = step
        self.note("train_end", step)
        _gate(gates, "trained", step, then_wait=("published", step - 1))
        self.published = step
        _gate(gates, "published", step)
        return {"step": step}

    def times(self, event: str) -> dict[int, float]:
        return {s: t for e, s, t in self.log if e == event}


def _cfg(k: int, steps: int = 5) -> RunConfig:
    return RunConfig(run_id=f"pipe-{k}", steps=steps, max_staleness=k)


def test_rollout_version_lags_by_max_staleness():
    assert [rollout_version(s, 0) for s in (1, 2, 3)] == [0, 1, 2]
    assert [rollout_version(s, 1) for s in (1, 2, 3, 4)] == [0, 0, 1, 2]
    with pytest.raises(ValueError):
        rollout_version(0, 1)


def test_one_step_off_policy_overlaps_and_keeps_the_bound():
    run = FakeRun(rollout_s=0.15, train_s=0.15)
    out = run_pipelined(run.step, _cfg(1), first=1, trainer="trainer-0")
    assert [o["step"] for o in out] == [1, 2, 3, 4, 5]
    assert max(run.lag_at_train.values()) == 1  # off-policy by exactly one version, never more
    assert all(0 <= lag <= 1 for lag in run.lag_at_train.values())
    rs, re, ts, te = (run.times(e) for e in ("rollout_start", "rollout_end", "train_start",
                                             "train_end"))
    for s in range(2, 6):
        assert rs[s] < te[s - 1]  # step s's rollout runs while step s-1 trains
        assert rs[s] >= re[s - 1]  # one rollout at a time
        if s > 2:
            assert rs[s] >= te[s - 2]  # never more than one step ahead of training
    assert active_gates("pipe-1") is None  # gates live only while the run does


def test_synchronous_steps_roll_out_with_the_trainers_version():
    run = FakeRun(rollout_s=0.01, train_s=0.01)
    cfg = _cfg(0, steps=3)
    for step in range(1, 4):  # what flows/train.py does with max_staleness = 0
        run.step(cfg, step)
    assert run.lag_at_train == {1: 0, 2: 0, 3: 0}


def test_a_failed_step_stops_the_one_in_flight_after_its_rollout():
    run = FakeRun(rollout_s=0.1, train_s=0.2, fail_train=3)
    with pytest.raises(RuntimeError, match="train 3 failed"):
        run_pipelined(run.step, _cfg(1), first=1, trainer="trainer-0")
    assert sorted(run.times("rollout_end")) == [1, 2, 3, 4]  # step 4's rollout finished
    assert sorted(run.times("train_end")) == [1, 2]  # nothing trained after the failure
    assert 5 not in run.times("rollout_start")


def test_resume_starts_after_the_trainers_version():
    run = FakeRun(rollout_s=0.01, train_s=0.01)
    run.trainer_version = run.published = 2  # a resumed run: trainer reloaded version 2
    out = run_pipelined(run.step, _cfg(1), first=3, trainer="trainer-0")
    assert [o["step"] for o in out] == [3, 4, 5]
    assert all(lag <= 1 for lag in run.lag_at_train.values())


def test_gates_raise_once_a_step_failed():
    from flows.pipeline import StepGates

    gates = StepGates(0, "trainer-0")
    gates.fail(RuntimeError("boom"))
    with pytest.raises(PipelineStopped):
        gates.wait("trained", 1)
    gates.wait("trained", 0)  # what is already done never blocks
    assert gates.placement == {"workers": ["trainer-0"], "allow_other_workers": False}


def test_serving_turns_lag_the_trainer_at_most_serving_lag_in_all():
    sync = RunConfig()
    assert serving_lag_cfg(sync) is sync  # synchronous: unchanged, serving workers lag 1
    piped = serving_lag_cfg(RunConfig(max_staleness=1))
    assert piped.rollout.serving_lag == 0  # the step's own version already lags by 1
    wider = serving_lag_cfg(RunConfig(max_staleness=1, rollout={"serving_lag": 3}))
    assert wider.rollout.serving_lag == 2


def test_publish_pushes_the_snapshot_of_its_version_while_the_trainer_moves_on(monkeypatch):
    import torch

    import tasks.publish
    from tasks.publish import keep_snapshot, weights_of

    class FakeTrainer:
        version = 0

        def weights_bf16(self, shared=False):
            self.shared = shared
            return {"w": torch.full((2,), float(self.version), dtype=torch.bfloat16)}

    cfg, trainer = RunConfig(run_id="snap-t", max_staleness=1), FakeTrainer()
    for version in (1, 2, 3):  # three updates; publish of 2 has not run yet
        trainer.version = version
        keep_snapshot(cfg, trainer)
    assert weights_of("snap-t", 2)["w"].tolist() == [2.0, 2.0]  # not the trainer's version 3
    assert weights_of("snap-t", 2)["w"].tolist() == [2.0, 2.0]  # kept for a retried publish
    monkeypatch.setattr(tasks.publish, "local_trainer", lambda run: trainer)
    assert weights_of("snap-t", 3)["w"].tolist() == [3.0, 3.0]
    with pytest.raises(RuntimeError, match="holds version 3, asked to publish 1"):
        weights_of("snap-t", 1)  # dropped (window 2..3), and the trainer moved on
    assert trainer.shared is False  # threads code: snapshots in plain memory
    cfg.publish.coder_processes = 2  # coder processes: where they read them
    keep_snapshot(cfg, trainer)
    assert trainer.shared is True
    cfg.publish.shard_split = 2  # (a sharded publish's parts are coded on threads)
    keep_snapshot(cfg, trainer)
    assert trainer.shared is False
