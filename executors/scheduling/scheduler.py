"""The elastic rollout scheduler's dispatch loop: every turn routed afresh over Dask.

Turns ready at the same moment for the same rollout worker travel as one Dask future (one
engine batch); a serving worker gets one future per turn (no head-of-line blocking behind the
turns admission holds back); results come back as they finish, environments step, and the next turns are routed
(cache-affine first, see executors/policies/router.py). Which workers take part, and when serving
workers admit turns, is executors/scheduling/worker_pool.py's business.

No trajectory is lost: a turn whose worker died (the Dask scheduler dropped it, seen within
`heartbeat_s`), failed, aborted it (KV cut, stall) or answered "stale" (it holds an older
policy) is re-prefilled elsewhere from the trajectory's history, and its row says "rerouted".

With DAPO dynamic sampling (executors/scheduling/group_launch.py) the loop launches groups until enough
have reward variance, then aborts the surplus in the engines (out of band: client.run) and
drops those trajectories from the step.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable

from distributed import Client, wait

from executors.scheduling.env_steps import POLL_S, EnvSteps
from executors.scheduling.episode import Episode
from executors.scheduling.group_launch import GroupLauncher
from executors.scheduling.report import RolloutReport, RolloutStuck  # noqa: F401 (re-exported)
from executors.workers.pinned import LostResult, fetch_result
from executors.workers.rollout_worker import generate_turns
from executors.policies.hw_affinity import STANDARD_CLASS, HwAffinity
from executors.policies.router import TurnRouter
from executors.policies.tail_handback import HandbackConfig, TailHandback
from executors.scheduling.worker_pool import WorkerPool
from core.config import SchedulerConfig

QUICK_FETCH_S = 1.0  # a finished batch's results from a live worker take ms

log = logging.getLogger("rose.rollout")


class RolloutScheduler:
    def __init__(self, client: Client, workers: dict[str, str], cap_per_worker: int | None = None,
                 mode: str | None = None, admits: Callable[[str], bool] | None = None, *,
                 config: SchedulerConfig | None = None, resync: Callable | None = None,
                 generate: Callable = generate_turns, classes: dict[str, str] | None = None,
                 **settings: Any) -> None:
        """Settings come from `config` (a run's RolloutConfig is one); `cap_per_worker`, `mode`
        and keyword `settings` (any SchedulerConfig field) override it. admits / resync /
        generate: hooks for tests, benches and the rollout task (admission oracle, weight
        resync, the function sent to workers). classes: rollout worker -> device class
        (tasks/placement.device_classes), refused by hw_affinity naming a class none has."""
        given = {k: v for k, v in (("max_concurrency_per_worker", cap_per_worker), ("routing", mode))
                 if v is not None}
        base = (config or SchedulerConfig()).model_dump(include=set(SchedulerConfig.model_fields))
        self.config = cfg = SchedulerConfig.model_validate({**base, **given, **settings})
        affinity = HwAffinity(cfg.hw_affinity)
        if cfg.hw_affinity:
            affinity.check((classes or {}).get(n, STANDARD_CLASS) for n, k in workers.items() if k == "rollout")
        self.client = client
        self.router = TurnRouter(cfg.max_concurrency_per_worker, cfg.routing, affinity)
        self.pool = WorkerPool(client, workers, self.router, heartbeat_s=cfg.heartbeat_s,
                               admits=admits, serving_max_turns=cfg.serving_max_turns_per_worker,
                               admission_refresh_s=cfg.admission_refresh_s, resync=resync,
                               max_rejoins=cfg.max_rejoins, classes=classes)
        self.kinds, self.routable = self.pool.kinds, self.pool.routable  # live views
        self.generate = generate

    # -- the loop ------------------------------------------------------------------------------
    def run(self, work: list[Episode] | GroupLauncher,
            on_turn: Callable[[dict], None] | None = None,
            on_trajectory: Callable[[Episode], None] | None = None) -> RolloutReport:
        """Every trajectory to its end; `on_turn(row)` after each turn, `on_trajectory(episode)`
        as each trajectory ends (e.g. its reward scored at once)."""
        t0 = time.perf_counter()
        launcher = work if isinstance(work, GroupLauncher) else GroupLauncher.fixed(work)
        self.report = RolloutReport([], 0.0)
        self.by_id: dict[str, Episode] = {}
        self.ready: deque[str] = deque()
        self.inflight: dict = {}  # future -> (worker, [trajectory ids], sent at)
        self.running: dict[str, tuple[str, str]] = {}  # trajectory -> (worker, request id)
        self.last_worker: dict[str, str] = {}  # trajectory -> worker of its last finished turn
        self.abandoned: set[str] = set()
        self.active: set[str] = set()
        self.failures: dict[str, int] = {}
        factor = self.config.handback_factor  # pinned trajectories never move: no hand-back
        self.handback = (TailHandback(HandbackConfig(factor=factor))
                         if factor and self.router.mode != "pinned" else None)
        self.env_steps = EnvSteps(self.config.env_threads)
        self.on_trajectory = on_trajectory
        self._start(launcher.launch())
        try:
            self._loop(launcher, on_turn)
        finally:
            self.env_steps.close()
        for fut in self.inflight:  # only surplus turns are left, already aborted in the engines
            fut.cancel()
        self.pool.close()
        r, p = self.report, self.pool
        r.dead_workers, r.excluded_workers, r.rejoined_workers = p.dead, p.excluded, p.rejoined
        r.events = p.events
        self.report.episodes = launcher.kept()
        self.report.sampling = launcher.summary()
        self.report.seconds = time.perf_counter() - t0
        return self.report

    def _loop(self, launcher: GroupLauncher, on_turn) -> None:
        progress = time.monotonic()
        while self.active:
            self._finish_env_steps(launcher, on_turn)
            self._on_lost(self.pool.poll())
            self._dispatch()
            self._hand_back_tail()
            if time.monotonic() - progress > self.config.stuck_after_s:
                raise RolloutStuck(f"no turn finished for {self.config.stuck_after_s:.0f} s; "
                                   f"{len(self.ready)} ready, routable: {sorted(self.routable)}")
            if not self.inflight:
                if self.env_steps:  # only environments are stepping: wait for the first
                    self._finish_env_steps(launcher, on_turn, self.pool.tick_s)
                    continue
                if not self.pool.any_left():
                    raise RolloutStuck(f"{len(self.ready)} turns ready but no worker is left")
                time.sleep(self.pool.tick_s)  # waiting for admission, a rejoin, or a free slot
                continue
            try:  # an environment step done meanwhile is picked up within POLL_S
                done, _ = wait(list(self.inflight), timeout=POLL_S if self.env_steps else self.pool.tick_s,
                               return_when="FIRST_COMPLETED")
            except TimeoutError:
                self._exclude_unresponsive()
                continue
            for fut in done:
                if fut in self.inflight and self._finish_batch(fut, launcher, on_turn):
                    progress = time.monotonic()
            self._exclude_unresponsive()

    def _start(self, episodes: list[Episode]) -> None:
        for ep in episodes:
            self.by_id[ep.trajectory_id] = ep
            self.active.add(ep.trajectory_id)
            self.ready.append(ep.trajectory_id)

    def _dispatch(self) -> None:
        batches: dict[str, list[str]] = {}
        self.ready = deque(t for t in self.ready if t not in self.abandoned)
        held: deque[str] = deque()
        if self.config.env_stepping == "batched":  # the baseline: turn k+1 waits for every turn k
            floor = min(self.by_id[t].turn for t in self.active)
            held = deque(t for t in self.ready if self.by_id[t].turn > floor)
            self.ready = deque(t for t in self.ready if self.by_id[t].turn <= floor)
        if self.router.mode == "turnwise_affinity":
            # First the turns whose prefix KV sits on a worker with room: a slot that just freed
            # goes to the trajectory that left it, not to an older queued turn that would
            # re-prefill there anyway (the older one takes the next slot anywhere).
            self.ready = self._place(batches, affine_only=True)
        self.ready = self._place(batches, affine_only=False) + held
        for worker, tids in batches.items():
            requests = [self.by_id[tid].request() for tid in tids]
            if self.config.serving_lag and self.kinds.get(worker) == "serving":
                for req in requests:
                    req.min_policy_version = max(0, req.min_policy_version - self.config.serving_lag)
            for tid, req in zip(tids, requests):
                self.running[tid] = (worker, req.request_id)
            # A serving worker gets one future per turn: its turns finish at very different
            # times (admission interleaves them with serving), and a batch would hold every
            # result until its slowest turn is done (head-of-line blocking). A rollout worker's
            # turns run as one engine batch and finish together anyway.
            groups = ([[i] for i in range(len(tids))] if self.kinds.get(worker) == "serving"
                      else [list(range(len(tids)))])
            for idx in groups:
                fut = self.client.submit(self.generate, [requests[i] for i in idx], workers=[worker],
                                         allow_other_workers=False, pure=False, retries=0)
                self.inflight[fut] = (worker, [tids[i] for i in idx], time.monotonic())
                self.report.batches += 1

    def _place(self, batches: dict[str, list[str]], affine_only: bool) -> deque[str]:
        """Route the ready turns in FIFO order; return those left waiting."""
        waiting: deque[str] = deque()
        full = False  # no worker has room for a turn without affinity: neither for the next
        for tid in self.ready:
            if full or (affine_only and tid not in self.last_worker):
                waiting.append(tid)
                continue
            tag = (self.by_id[tid].env.name or None) if self.router.affinity.classes else None
            worker = self.router.route(tid, self.pool.admits, tag)
            if worker is None or (affine_only and worker != self.last_worker[tid]):
                waiting.append(tid)
                full = worker is None and not affine_only and self.router.mode != "pinned"
                continue
            self.router.on_turn_start(tid, worker)
            batches.setdefault(worker, []).append(tid)
        return waiting

    def _hand_back_tail(self) -> None:
        """Borrowed turns out too long while a dedicated worker has room are aborted on their
        serving worker; the "abort" answer reroutes them (executors/policies/tail_handback.py)."""
        if self.handback is None:
            return
        borrowed, where = {}, {}
        for worker, tids, sent in self.inflight.values():
            if self.kinds.get(worker) != "serving":
                continue
            for tid in tids:
                if tid in self.running and tid not in self.abandoned:
                    key = (tid, self.by_id[tid].turn)
                    borrowed[key], where[key] = sent, worker
        if not borrowed:
            return
        free = sum(max(0, self.router.cap - self.router.load(w)) for w in self.routable
                   if self.kinds.get(w) == "rollout")
        for key in self.handback.due(borrowed, free, len(self.ready), time.monotonic()):
            self.report.handed_back += 1
            self.pool.abort(where[key], [self.running[key[0]][1]])

    def _finish_batch(self, fut, launcher: GroupLauncher, on_turn) -> bool:
        worker, tids, sent = self.inflight.pop(fut)
        try:
            results = self._fetch(fut, worker)
        except Exception as exc:  # worker died (also: with the results), or the batch failed
            self._batch_failed(worker, tids, exc)
            return False
        stale, progressed = [], False
        for tid, result in zip(tids, results):
            if tid in self.abandoned:
                continue
            self.running.pop(tid, None)
            if result.finished_reason == "stale":
                stale.append(tid)  # still in flight for the router: rerouted with the worker
                continue
            if not result.ok:  # aborted: emergency KV cut or stall on a co-serving executor
                self.router.on_turn_aborted(tid, worker)
                self.pool.on_abort(worker)
                returned = result.finished_reason == "returned"  # handed back unstarted: no attempt lost
                self.report.returned_unstarted += returned
                if not returned:
                    self.report.interrupted[worker] = self.report.interrupted.get(worker, 0) + 1
                self._give_back(tid, result.finished_reason)
                continue
            self.router.on_turn_end(tid, worker)
            if self.handback is not None and self.kinds.get(worker) == "rollout":
                self.handback.on_dedicated_turn(time.monotonic() - sent)
            self.last_worker[tid] = worker
            ep, progressed = self.by_id[tid], True
            if ep.env.blocking:  # steps on a thread of its own; the others go on meanwhile
                self.env_steps.submit(tid, ep, result)
                continue
            self._turn_done(tid, ep.apply(result), launcher, on_turn)
        self.failures.pop(worker, None)
        if stale:
            log.warning("%s answered stale (older policy than v%d): excluding it", worker,
                        self.by_id[stale[0]].min_policy_version)
            self._remove(worker, dead=False)
            self.pool.try_rejoin(worker)
        return progressed

    def _turn_done(self, tid: str, row: dict, launcher: GroupLauncher, on_turn) -> None:
        """A turn and its environment step are done: its row out, its next turn ready (or the
        trajectory done and the launcher told)."""
        ep = self.by_id[tid]
        if on_turn:
            on_turn(row)
        if not ep.done:
            self.ready.append(tid)
            return
        self.router.forget(tid)
        self.active.discard(tid)
        if self.on_trajectory is not None:
            self.on_trajectory(ep)
        self._abandon(launcher.on_trajectory_done(ep))
        self._start(launcher.launch())

    def _finish_env_steps(self, launcher: GroupLauncher, on_turn, timeout_s: float = 0.0) -> None:
        for tid, result, reply, outcome, env_s in self.env_steps.finished(timeout_s):
            if tid not in self.abandoned:  # a surplus trajectory's step is dropped with it
                self._turn_done(tid, self.by_id[tid].record(result, reply, outcome, env_s), launcher, on_turn)

    def _fetch(self, fut, worker: str):
        """A finished batch's results. One whose worker died holding them (Dask reschedules
        it on the dead address) is lost: told at once when the worker is gone or restarted
        (a new address), rather than after result_timeout_s with the dispatch loop stalled."""
        try:
            return fut.result(timeout=QUICK_FETCH_S)
        except TimeoutError:
            if fut.status == "error":  # the function itself raised a TimeoutError
                raise
        if self.pool.liveness.addresses().get(worker) != self.pool.address(worker):
            fut.cancel()
            raise LostResult(f"{worker} left holding the results of {fut.key}")
        return fetch_result(fut, self.config.result_timeout_s)

    def _batch_failed(self, worker: str, tids: list[str], exc: Exception) -> None:
        if worker not in self.routable:
            return  # already removed: its turns went back to the queue then
        log.warning("turn batch on %s failed (%s: %s); rerouting %d turns", worker,
                    type(exc).__name__, exc, len(tids))
        self._on_lost(self.pool.poll(force=True))
        if worker not in self.routable:
            return  # it died: _remove rerouted this batch with the rest of its turns
        for tid in tids:
            if tid not in self.abandoned:
                self.running.pop(tid, None)
                self.router.on_turn_aborted(tid, worker)
                self._give_back(tid, type(exc).__name__)
        self.failures[worker] = self.failures.get(worker, 0) + 1
        if self.failures[worker] >= self.config.max_batch_failures:
            self._remove(worker, dead=False)

    def _give_back(self, tid: str, why: str) -> None:
        ep = self.by_id[tid]
        ep.give_back(unstarted=why == "returned")
        if ep.attempt - ep.returned >= self.config.max_attempts_per_turn * (ep.turn + 1):
            raise RolloutStuck(f"trajectory {tid} turn {ep.turn} failed {ep.attempt} attempts "
                               f"(last: {why})")
        self.report.rerouted_turns += 1
        self.ready.append(tid)

    # -- workers leaving -------------------------------------------------------------------------
    def _on_lost(self, names: list[str]) -> None:
        for name in names:
            log.warning("%s is gone (Dask dropped it): rerouting its turns", name)
            self._remove(name, dead=True)

    def _exclude_unresponsive(self) -> None:
        """Failed health check: a live worker that answers no batch within turn_timeout_s (a hung
        engine, a stall its executor did not report) is excluded and its turns rerouted."""
        now = time.monotonic()
        late: dict[str, list[str]] = {}
        for worker, tids, sent in self.inflight.values():
            if now - sent > self.config.turn_timeout_s and worker in self.routable:
                late.setdefault(worker, []).extend(tids)
        for worker, tids in late.items():
            log.warning("%s answered no turn for %.0f s: excluding it, rerouting its turns",
                        worker, self.config.turn_timeout_s)
            self.pool.abort(worker, [self.running[t][1] for t in tids if t in self.running])
            self._remove(worker, dead=False)

    def _remove(self, name: str, dead: bool) -> None:
        lost = self.pool.remove(name, dead)
        for fut, (worker, *_) in list(self.inflight.items()):
            if worker == name:
                del self.inflight[fut]
                fut.cancel()
        for tid in lost:
            self.running.pop(tid, None)
            if tid not in self.abandoned:
                self._give_back(tid, "worker lost" if dead else "worker excluded")

    # -- dynamic sampling: surplus ---------------------------------------------------------------
    def _abandon(self, tids: list[str]) -> None:
        by_worker: dict[str, list[str]] = {}
        for tid in tids:
            self.abandoned.add(tid)
            self.active.discard(tid)
            if tid in self.running:
                worker, request_id = self.running.pop(tid)
                by_worker.setdefault(worker, []).append(request_id)
            try:
                self.router.forget(tid)  # frees its slot now; its late result is ignored
            except KeyError:
                pass  # never started
        for worker, ids in by_worker.items():
            self.report.aborted_turns += self.pool.abort(worker, ids)
