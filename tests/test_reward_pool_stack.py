"""The elastic reward pool on a real Dask scheduler: the controller (rose/stack/reward_pool.py,
as `rose up --reward-workers N` starts it) runs no worker while idle, starts reward workers when
trajectories wait to be scored, and retires them when the queue is empty again."""
from __future__ import annotations

import sys
import time

import pytest

from envs.latency import StepLatency
from executors.scheduling.reward_service import RewardService, RewardServiceError, pool_usage
from rose.stack.dask_cluster import REPO_ROOT, start_scheduler
from coordination.dask_security import DaskScheduler
from rose.stack.process import ManagedProcess
from coordination.reward_pool_state import read_pool_state

pytestmark = pytest.mark.slow


def _reward_workers(client) -> list[str]:
    return sorted(str(w["name"]) for w in client.scheduler_info(n_workers=-1)["workers"].values()
                  if "reward_cpu" in (w.get("resources") or {}))


def _wait(what, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_pool_scales_from_zero_with_the_queue_and_back(tmp_path):
    address, scheduler = start_scheduler(tmp_path)
    controller = ManagedProcess("reward-pool", [
        sys.executable, "-m", "rose.stack.reward_pool", "--scheduler", address, "--run-dir", str(tmp_path),
        "--max-workers", "2", "--threads", "2"], tmp_path, env={"PYTHONPATH": str(REPO_ROOT)}, cwd=REPO_ROOT)
    controller.start()
    try:
        with DaskScheduler(address).client() as client:
            _wait(lambda: read_pool_state(tmp_path) is not None)
            time.sleep(1.0)
            assert _reward_workers(client) == []  # idle: nothing runs
            t0 = time.time()
            service = RewardService(client, "run-a", seed_of=lambda g: 100 + g, max_turns=4,
                                    cost=StepLatency(mean_s=0.4), timeout_s=120)
            rows = [{"trajectory": f"t{i}", "env": "frozenlake", "group": i // 4, "turn": 0,
                     "response_text": "right", "reward": 0.0} for i in range(12)]
            for row in rows:
                service.submit([row])
            got = service.collect()
            assert set(got) == {f"t{i}" for i in range(12)}
            assert {r.worker for r in got.values()} <= {"reward-0", "reward-1"}
            assert RewardService.apply(rows, got) == 0  # the scorer agrees with the environment
            summary = pool_usage(read_pool_state(tmp_path), got, t0, time.time())
            assert summary["trajectories"] == 12 and summary["peak_workers"] == 2  # 12 queued: the cap
            assert summary["scale_ups"] == 2 and summary["scale_up_s_max"] > 0
            # each worker scores `threads` trajectories at once (its reward_cpu = its threads)
            overlapping = [(a, b) for a in got.values() for b in got.values()
                           if a is not b and a.worker == b.worker and a.started < b.finished and b.started < a.finished]
            assert overlapping, "no reward worker ever scored two trajectories at once"
            assert 0 < summary["utilization"] <= 1 and summary["queue_s_max"] > 0
            _wait(lambda: _reward_workers(client) == [])  # idle again: retired
            _wait(lambda: all(spans[-1][1] is not None  # ... and recorded as down
                              for spans in read_pool_state(tmp_path)["workers"].values()))
            assert read_pool_state(tmp_path)["pending"] == 0

            # no pool at all: the wait is bounded and the error says what to start
            controller.stop()
            lonely = RewardService(client, "run-a", seed_of=lambda g: g, max_turns=4, timeout_s=1.0)
            lonely.submit([rows[0]])
            with pytest.raises(RewardServiceError, match="reward-workers"):
                lonely.collect()
    finally:
        controller.stop()
        scheduler.stop()


def test_a_restarted_controller_retires_the_workers_its_predecessor_left(tmp_path):
    """The controller SIGKILLed (the supervisor starts it again with the same command line): the
    reward worker it had started lives on, unmanaged; the new controller retires it first."""
    import os
    import signal

    address, scheduler = start_scheduler(tmp_path)
    argv = [sys.executable, "-m", "rose.stack.reward_pool", "--scheduler", address, "--run-dir", str(tmp_path),
            "--max-workers", "1", "--min-workers", "1", "--threads", "1"]  # min 1: a worker up at once
    first = ManagedProcess("reward-pool", argv, tmp_path, env={"PYTHONPATH": str(REPO_ROOT)}, cwd=REPO_ROOT)
    second = ManagedProcess("reward-pool", argv, tmp_path, env={"PYTHONPATH": str(REPO_ROOT)}, cwd=REPO_ROOT)
    first.start()
    try:
        with DaskScheduler(address).client() as client:
            _wait(lambda: _reward_workers(client) == ["reward-0"])
            before = {w["name"]: a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
            os.kill(first.pid, signal.SIGKILL)
            first.popen.wait(timeout=10)
            assert _reward_workers(client) == ["reward-0"]  # orphaned, still registered
            second.start()
            # the stray is retired, then the new controller's own reward-0 registers (min 1)
            _wait(lambda: before["reward-0"] not in client.scheduler_info(n_workers=-1)["workers"])
            _wait(lambda: _reward_workers(client) == ["reward-0"])
    finally:
        second.stop()
        first.stop()
        scheduler.stop()
