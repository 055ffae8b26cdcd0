"""Blocking environments step off the scheduler's thread: one trajectory's slow step holds up
no other trajectory (no turn-wide barrier), over the scheduler tests' in-process Dask cluster."""
from __future__ import annotations

import threading

import pytest

from envs.base import StepResult
from executors.scheduling.env_steps import EnvSteps
from executors.scheduling.episode import Episode
from tests.test_rollout_scheduler import TURNS, TWO, CoinEnv, FakeChat, cluster, scheduler  # noqa: F401

OTHERS_DONE = threading.Event()


class HeldEnv(CoinEnv):
    """Its first step waits until every other trajectory has finished (or 20 s: then it says so)."""

    blocking = True

    def step(self, reply):
        if self.turn == 0:
            self.waited_out = not OTHERS_DONE.wait(20)
        return super().step(reply)


class ThreadedCoinEnv(CoinEnv):
    blocking = True


def _episode(i: int, env) -> Episode:
    return Episode(run="t", step=1, group=0, trajectory_id=f"s1-g0-t{i}", env=env, env_seed=0,
                   chat=FakeChat(), max_turns=8, max_tokens=4, temperature=1.0, top_p=1.0,
                   min_policy_version=0)


def test_a_slow_environment_step_holds_up_no_other_trajectory(cluster):  # noqa: F811
    _, client = cluster
    OTHERS_DONE.clear()
    held = HeldEnv()
    eps = [_episode(0, held)] + [_episode(i, ThreadedCoinEnv() if i % 2 else CoinEnv()) for i in range(1, 6)]
    finished: list[str] = []

    def on_turn(row: dict) -> None:
        if row["done"]:
            finished.append(row["trajectory"])
            if len(finished) == len(eps) - 1:
                OTHERS_DONE.set()

    report = scheduler(client, TWO).run(eps, on_turn=on_turn)
    assert not held.waited_out  # the others all finished while its first step was held
    assert finished[-1] == "s1-g0-t0" and len(finished) == len(eps)
    assert len(report.rows) == len(eps) * TURNS and {r["status"] for r in report.rows} == {"ok"}


class Boom(CoinEnv):
    blocking = True

    def step(self, reply):
        raise RuntimeError("environment container died")


def test_env_steps_come_back_in_trajectory_order_and_raise_as_inline_steps_would():
    from executors.turns import TurnResult

    steps = EnvSteps(threads=4)
    eps = {tid: _episode(i, ThreadedCoinEnv()) for i, tid in enumerate(["b", "a", "c"])}
    for tid, ep in eps.items():
        steps.submit(tid, ep, TurnResult(f"{tid}/t0", tid, [119, 105, 110], [0.0] * 3, "stop", "w", "rollout"))
    got = []
    while steps:
        got += steps.finished(timeout_s=5.0)
    assert sorted(t for t, *_ in got) == ["a", "b", "c"]
    assert all(outcome.observation == "turn 1" and env_s >= 0 for _, _, _, outcome, env_s in got)
    bad = _episode(9, Boom())
    steps.submit("x", bad, TurnResult("x/t0", "x", [119], [0.0], "stop", "w", "rollout"))
    with pytest.raises(RuntimeError, match="container died"):
        while steps:
            steps.finished(timeout_s=5.0)
    steps.close()
    with pytest.raises(ValueError, match=">= 1"):
        EnvSteps(threads=0)


def test_step_result_is_what_an_inline_step_gives():
    a, b = _episode(1, CoinEnv()), _episode(1, CoinEnv())
    from executors.turns import TurnResult

    r = TurnResult("t/t0", "s1-g0-t1", [119, 105, 110], [0.0] * 3, "stop", "w", "rollout")
    inline = a.apply(r)
    reply = b.reply_text(r)
    outcome, env_s = b.step_env(reply)
    split = b.record(r, reply, outcome, env_s)
    for key in ("prompt_ids", "response_ids", "reward", "done", "status", "turn"):
        assert inline[key] == split[key]
    assert a.tokens == b.tokens
    assert isinstance(outcome, StepResult)


class SlowEnv(CoinEnv):
    blocking = True

    def step(self, reply):
        threading.Event().wait(0.3)  # a slow environment: its trajectory falls behind
        return super().step(reply)


@pytest.mark.parametrize("stepping", ["trajectory", "batched"])
def test_batched_stepping_is_a_turn_wide_barrier_and_trajectory_stepping_is_not(cluster, stepping):  # noqa: F811
    _, client = cluster
    eps = [_episode(0, SlowEnv())] + [_episode(i, ThreadedCoinEnv()) for i in range(1, 4)]
    turns: list[int] = []
    report = scheduler(client, TWO, env_stepping=stepping).run(eps, on_turn=lambda row: turns.append(row["turn"]))
    assert len(report.rows) == len(eps) * TURNS
    in_order = turns == sorted(turns)  # every turn k came back before any turn k+1
    assert in_order if stepping == "batched" else not in_order
