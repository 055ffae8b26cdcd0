"""The elastic rollout scheduler's dispatch loop: every turn routed afresh over Dask.

Turns ready at the same moment for the same worker travel as one Dask future (one engine
batch); results come back as they finish, environments step, and the next turns are routed
(cache-affine first, see executors/router.py). A turn lost to a dead, stalled or stale
worker is re-prefilled elsewhere from the trajectory's history: no trajectory is lost.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from distributed import Client, wait

from executors.episode import Episode
from executors.rollout_worker import generate_turns
from executors.router import TurnRouter, WorkerInfo

log = logging.getLogger("rose.rollout")


class RolloutStuck(RuntimeError):
    pass


@dataclass
class RolloutReport:
    episodes: list[Episode]
    seconds: float
    rerouted_turns: int = 0
    dead_workers: list[str] = field(default_factory=list)
    batches: int = 0

    @property
    def rows(self) -> list[dict]:
        return [row for ep in self.episodes for row in ep.rows]


class RolloutScheduler:
    def __init__(self, client: Client, workers: dict[str, str], cap_per_worker: int = 16,
                 mode: str = "turnwise_affinity", admits: Callable[[str], bool] | None = None,
                 max_attempts_per_turn: int = 5) -> None:
        if not any(kind == "rollout" for kind in workers.values()):
            raise ValueError("rollout needs at least one rollout worker")
        self.client, self.admits = client, admits
        self.router = TurnRouter(cap_per_worker, mode)
        for name, kind in workers.items():
            self.router.register_worker(WorkerInfo(name, kind))
        self.max_attempts = max_attempts_per_turn

    def _alive(self) -> set[str]:
        return {w["name"] for w in self.client.scheduler_info()["workers"].values()}

    def run(self, episodes: list[Episode], on_turn: Callable[[dict], None] | None = None
            ) -> RolloutReport:
        t0 = time.perf_counter()
        report = RolloutReport(episodes, 0.0)
        by_id = {ep.trajectory_id: ep for ep in episodes}
        ready = deque(ep.trajectory_id for ep in episodes)
        inflight: dict = {}
        while ready or inflight:
            self._dispatch(ready, by_id, inflight, report)
            if not inflight:
                raise RolloutStuck(f"{len(ready)} turns ready but no worker can take them "
                                   f"(workers: {[w.name for w in self.router.workers()]})")
            done, _ = wait(list(inflight), return_when="FIRST_COMPLETED")
            for fut in done:
                worker, tids = inflight.pop(fut)
                try:
                    results = fut.result()
                except Exception as exc:  # worker died or the batch failed: reroute every turn
                    self._lose_worker(worker, tids, by_id, ready, report, exc)
                    continue
                for tid, result in zip(tids, results):
                    ep = by_id[tid]
                    if not result.ok:  # aborted (KV cut / stall) or stale weights
                        self.router.on_turn_aborted(tid, worker)
                        self._give_back(ep, ready, report, result.finished_reason)
                        continue
                    self.router.on_turn_end(tid, worker)
                    row = ep.apply(result)
                    if on_turn:
                        on_turn(row)
                    if ep.done:
                        self.router.forget(tid)
                    else:
                        ready.append(tid)
        report.seconds = time.perf_counter() - t0
        return report

    def _dispatch(self, ready: deque, by_id: dict, inflight: dict, report: RolloutReport) -> None:
        batches: dict[str, list[str]] = {}
        waiting = deque()
        while ready:
            tid = ready.popleft()
            worker = self.router.route(tid, self.admits)
            if worker is None:
                waiting.append(tid)
                continue
            self.router.on_turn_start(tid, worker)
            batches.setdefault(worker, []).append(tid)
        ready.extend(waiting)
        for worker, tids in batches.items():
            requests = [by_id[tid].request() for tid in tids]
            fut = self.client.submit(generate_turns, requests, workers=[worker],
                                     allow_other_workers=False, pure=False, retries=0)
            inflight[fut] = (worker, tids)
            report.batches += 1

    def _give_back(self, ep: Episode, ready: deque, report: RolloutReport, why: str) -> None:
        if ep.attempt >= self.max_attempts * (ep.turn + 1):
            raise RolloutStuck(f"trajectory {ep.trajectory_id} turn {ep.turn} failed "
                               f"{ep.attempt} attempts (last: {why})")
        ep.give_back()
        report.rerouted_turns += 1
        ready.append(ep.trajectory_id)

    def _lose_worker(self, worker: str, tids: list[str], by_id: dict, ready: deque,
                     report: RolloutReport, exc: Exception) -> None:
        dead = worker not in self._alive()
        log.warning("turn batch on %s failed (%s: %s); rerouting %d turns%s", worker,
                    type(exc).__name__, exc, len(tids), " - worker is gone" if dead else "")
        if dead and any(w.name == worker for w in self.router.workers()):
            self.router.remove_worker(worker)  # returns in-flight ids; we reroute tids below
            report.dead_workers.append(worker)
        for tid in tids:
            if not dead:
                self.router.on_turn_aborted(tid, worker)
            self._give_back(by_id[tid], ready, report, f"{type(exc).__name__}")
