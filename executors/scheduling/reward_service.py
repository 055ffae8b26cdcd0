"""Trajectory rewards from the stack's elastic reward pool (rose/stack/reward_pool.py), as the
driver sees it: `submit` a finished trajectory's rows (during the rollout, as each ends, or all
at once after it: the batch baseline), `collect` every reward, `usage` for the step summary.

A reward job holds what a stateless scorer needs (executors/workers/reward_host.py): the
environment, its seed, the replies in order. Jobs go to workers with the reward_cpu resource;
while none is up they wait in the scheduler ("no-worker"), which is what makes the pool start
one. A reward the pool could not give within `timeout_s` fails the step, naming the trajectory.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from distributed import Client
from distributed import wait as wait_all

from envs.latency import StepLatency
from executors.policies.reward_pool import PoolUsage, Scored
from executors.workers.reward_host import RewardJob, RewardResult, score_trajectory
from core.worker_kinds import KIND_RESOURCE

RESOURCE = KIND_RESOURCE["reward"]


class RewardServiceError(RuntimeError):
    """The reward pool did not score every trajectory."""


class RewardService:
    def __init__(self, client: Client, run: str, seed_of: Callable[[int], int], max_turns: int,
                 cost: StepLatency | None = None, timeout_s: float = 300.0) -> None:
        self.client, self.run, self.seed_of = client, run, seed_of
        self.max_turns, self.cost, self.timeout_s = max_turns, cost, timeout_s
        self.futures: dict[str, object] = {}  # trajectory -> its scoring future, until it is in
        self.results: dict[str, RewardResult] = {}  # ... here: fetched as each lands
        self._lock = threading.Lock()

    def submit(self, rows: list[dict]) -> None:
        """Score one finished trajectory (its rows, in turn order)."""
        tid = rows[0]["trajectory"]
        job = RewardJob(self.run, tid, rows[0]["env"], self.seed_of(rows[0]["group"]),
                        tuple(r["response_text"] for r in rows), self.max_turns, time.time(), self.cost)
        fut = self.client.submit(score_trajectory, job, resources={RESOURCE: 1},
                                 key=f"reward-{self.run}-{tid}-{time.time_ns()}", pure=False)
        with self._lock:
            self.futures[tid] = fut
        fut.add_done_callback(lambda f, tid=tid: self._landed(tid, f))

    def _landed(self, tid: str, fut) -> None:
        """Fetch a reward as soon as it is scored and let the worker forget it: a pool that
        scales down meanwhile loses nothing (a result left on a retired worker is recomputed)."""
        if fut.status != "finished":
            return  # an error or a cancel: collect() reports it
        result = fut.result()
        with self._lock:
            if self.futures.get(tid) is fut:
                self.results[tid] = result
                del self.futures[tid]

    @property
    def submitted(self) -> list[str]:
        with self._lock:
            return [*self.futures, *self.results]

    def cancel(self, trajectory_ids: list[str]) -> None:
        """Drop these trajectories' scoring (surplus trajectories the rollout abandoned)."""
        with self._lock:
            for tid in trajectory_ids:
                self.results.pop(tid, None)
                fut = self.futures.pop(tid, None)
                if fut is not None:
                    fut.cancel()

    def collect(self) -> dict[str, RewardResult]:
        """Every submitted trajectory's reward, waiting up to timeout_s for the last."""
        with self._lock:
            waiting = list(self.futures.values())
        try:
            wait_all(waiting, timeout=self.timeout_s)
        except TimeoutError:
            pass  # distributed's wait raises where concurrent.futures' returns: the count says
        with self._lock:
            landed = [(t, f) for t, f in self.futures.items() if f.done()]
        for tid, fut in landed:  # their callbacks may not have run yet
            self._landed(tid, fut)
        with self._lock:
            late = sorted(self.futures)
            total = len(self.futures) + len(self.results)
        if late:
            failed = next((f for f in waiting if f.status == "error"), None)
            if failed is not None:
                failed.result()  # the scorer's own error, raised here with its traceback
            raise RewardServiceError(f"the reward pool scored {total - len(late)} of "
                                     f"{total} trajectories "
                                     f"within {self.timeout_s:.0f} s (waiting: {late[:3]}...); is the stack's "
                                     "reward pool up (`rose up --reward-workers N`, `rose status`)?")
        return dict(self.results)

    @staticmethod
    def apply(rows: list[dict], rewards: dict[str, RewardResult]) -> int:
        """Each row's trajectory_reward from the pool; returns how many trajectories' rewards
        differ from their environment's own sum (0 for deterministic environments)."""
        env_sum: dict[str, float] = {}
        for r in rows:
            env_sum[r["trajectory"]] = env_sum.get(r["trajectory"], 0.0) + r["reward"]
        for r in rows:
            r["trajectory_reward"] = rewards[r["trajectory"]].reward
        return sum(abs(env_sum[t] - rewards[t].reward) > 1e-9 for t in env_sum if t in rewards)


def pool_usage(state: dict | None, rewards: dict[str, RewardResult], t0: float, t1: float) -> dict:
    """The reward pool over [t0, t1] from its controller's record (rose/stack/reward_pool.py)
    and the step's rewards: utilization, queueing, scale-ups."""
    if not state:
        return {}
    up = {w: [(a, b) for a, b in spans] for w, spans in state.get("workers", {}).items()}
    scored = [Scored(r.worker, r.submitted, r.started, r.finished) for r in rewards.values()]
    usage = PoolUsage(t0, max(t0, t1), up, scored, [tuple(x) for x in state.get("scale_ups", [])])
    return usage.summary(threads=int(state.get("policy", {}).get("threads", 1)))
