"""The workers one rollout routes to, as they come and go.

Membership only; the dispatch loop (executors/scheduling/scheduler.py) owns the turns. A worker
leaves the pool when Dask drops it (dead: executors/scheduling/liveness.py) or when the loop excludes
it (it answered "stale", or its batches keep failing). A dead worker's nanny may bring it back,
with fresh state (policy version 0, empty prefix cache); such a worker, like an excluded one,
rejoins only through `resync(name, kind) -> Future` (pull the step's weights), at most
`max_rejoins` times per rollout, and as a new incarnation for the router (no stale affinity).
Without `resync` it stays out for the rest of the rollout: it is never retried in a loop.
Serving workers are routable only while their co-serving executor admits
(executors/scheduling/admission_view.py), unless the caller supplies `admits` (policy-only runs).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from executors.policies.router import TurnRouter, WorkerInfo
from executors.scheduling.admission_view import ServingAdmission
from executors.scheduling.liveness import WorkerLiveness
from executors.workers.pinned import fetch_result

log = logging.getLogger("rose.rollout")


def abort_turns(request_ids: list[str], dask_worker=None) -> int:
    """Runs out of band on a worker (client.run): abort these turns in its engines now.

    Out of band because the worker's task threads may all be blocked in generate_turns.
    Contract with the co-serving executor: its plugin has `abort(ids)` or `loop.abort(ids)`.
    """
    hit = 0
    for name in ("rose-rollout", "rose-coserving"):
        plugin = dask_worker.plugins.get(name) if dask_worker is not None else None
        fn = getattr(plugin, "abort", None) or getattr(getattr(plugin, "loop", None), "abort", None)
        if callable(fn):
            fn(list(request_ids))
            hit += 1
    return hit



class WorkerPool:
    def __init__(self, client, workers: dict[str, str], router: TurnRouter, *,
                 heartbeat_s: float = 0.5, admits: Callable[[str], bool] | None = None,
                 serving_max_turns: int = 16, admission_refresh_s: float = 0.3,
                 resync: Callable | None = None, max_rejoins: int = 1,
                 classes: dict[str, str] | None = None) -> None:
        if not workers:
            raise ValueError("rollout needs at least one rollout or serving worker")
        self.client, self.kinds, self.router = client, dict(workers), router
        self.classes = dict(classes or {})  # rollout worker -> device class (hw_affinity)
        for name, kind in workers.items():
            router.register_worker(self._info(name))
        self.routable = set(workers)
        self.liveness = WorkerLiveness(client, list(workers), heartbeat_s)
        serving = [n for n, k in workers.items() if k == "serving"]
        self.admission = None
        if admits is None and serving:
            self.admission = ServingAdmission(client, serving, self._load, serving_max_turns,
                                              admission_refresh_s)
            admits = self.admission.admits
        self.admits = admits
        self.tick_s = min(heartbeat_s, admission_refresh_s) if serving else heartbeat_s
        self.resync, self.max_rejoins = resync, max_rejoins
        self.resyncing: dict = {}  # future -> worker name
        self.rejoins: dict[str, int] = {}
        self.dead: list[str] = []
        self.excluded: list[str] = []
        self.rejoined: list[str] = []
        self.events: list[tuple[float, str, str]] = []  # (unix time, what, worker)

    def _info(self, name: str) -> WorkerInfo:
        kind = self.kinds[name]
        cls = self.classes.get(name) if kind == "rollout" else None
        return WorkerInfo(name, kind) if cls is None else WorkerInfo(name, kind, cls)

    def _load(self, name: str) -> int:
        return self.router.load(name) if name in self.routable else 0

    def address(self, name: str) -> str | None:
        return self.liveness.address(name)

    def any_left(self) -> bool:
        """Some worker can still take turns, now or after a weight sync."""
        return bool(self.routable or self.resyncing)

    def poll(self, force: bool = False) -> list[str]:
        """Routable workers that died since the last look (the caller reroutes their turns).
        Also: returned incarnations start a resync, finished resyncs rejoin, admission refreshes."""
        events = self.liveness.poll(force)
        if self.admission is not None:  # a lost worker's poll answer is lost with it: no fetch
            for name in events.lost:
                self.admission.drop(name)
        for name in events.returned:
            log.warning("%s came back as a new incarnation (fresh state)", name)
            self.try_rejoin(name)
        for fut in [f for f in self.resyncing if f.done()]:
            name = self.resyncing.pop(fut)
            try:
                fetch_result(fut)  # bounded: the worker may have died holding it
            except Exception as exc:
                log.warning("weight sync on %s failed (%s): it stays out", name, exc)
                continue
            if name not in self.routable and self.liveness.address(name) is not None:
                self.router.register_worker(self._info(name))
                self.routable.add(name)
                if self.admission is not None and self.kinds[name] == "serving":
                    self.admission.add(name)
                self.rejoined.append(name)
                self.events.append((time.time(), "rejoined", name))
        if self.admission is not None:
            self.admission.refresh()
        return [n for n in events.lost if n in self.routable]

    def remove(self, name: str, dead: bool) -> list[str]:
        """Take a worker out; return the trajectories whose turn it was running (to reroute)."""
        lost = self.router.remove_worker(name)
        self.routable.discard(name)
        (self.dead if dead else self.excluded).append(name)
        self.events.append((time.time(), "lost" if dead else "excluded", name))
        if self.admission is not None:
            self.admission.drop(name)
        return lost

    def try_rejoin(self, name: str) -> None:
        if self.resync is None or self.rejoins.get(name, 0) >= self.max_rejoins:
            return
        fut = self.resync(name, self.kinds[name])
        if fut is not None:
            self.rejoins[name] = self.rejoins.get(name, 0) + 1
            self.resyncing[fut] = name

    def abort(self, name: str, request_ids: list[str]) -> int:
        """Abort these turns in the worker's engines now; returns how many were asked."""
        address = self.liveness.address(name)
        # gone since the last liveness poll (or restarted: a new address): a run to a dead
        # address would wait out Dask's connect timeout (30 s), the rollout stalled meanwhile
        if address is None or self.liveness.addresses().get(name) != address:
            return 0
        try:
            self.client.run(abort_turns, request_ids, workers=[address], on_error="ignore")
        except Exception as exc:  # the turns finish on their own; their results are ignored
            log.warning("abort on %s failed: %s", name, exc)
            return 0
        return len(request_ids)

    def on_abort(self, name: str) -> None:
        """A serving worker gave a turn back: its gate closes until the next admission poll."""
        if self.admission is not None:
            self.admission.on_abort(name)

    def close(self) -> None:
        if self.admission is not None:
            self.admission.close()
        for fut in self.resyncing:
            fut.cancel()
