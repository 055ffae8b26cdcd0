"""The elastic reward pool's controller: one service of the stack (`rose up --reward-workers N`)
that starts and retires reward workers (kind `reward`, resource reward_cpu) as the reward queue
grows and empties, 0 while idle, up to N.

It is a Dask adaptive deployment (distributed's AdaptiveCore: target, plan, requested,
observed, scale_up, scale_down), not Dask's `Adaptive` with a cluster object: the stack's
workers are `dask worker` processes of several kinds, and only the reward kind scales. The
target is executors/policies/reward_pool.py's, from the reward tasks the scheduler holds
(waiting for a worker or being scored). Workers run in this service's process group, so `rose
down` (and the supervisor, when it restarts this service) takes them along; a controller started
again first retires reward workers it did not start. What it did (each worker's up/down times,
each scale-up's request and registration) goes to <stack dir>/reward_pool.json for the runs'
step summaries (utilization, scale-up delay).

    python -m rose.stack.reward_pool --scheduler tcp://127.0.0.1:P --run-dir D --max-workers N
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from distributed.deploy.adaptive_core import AdaptiveCore

from coordination.dask_security import DaskScheduler
from coordination.reward_pool_state import STATE_FILE
from core.worker_kinds import KIND_RESOURCE
from executors.policies.reward_pool import RewardPoolPolicy
from rose.stack.dask_cluster import WorkerSpec, start_worker
from rose.stack.process import ManagedProcess
from storage.atomic import write_atomic

INTERVAL_S = 0.5
RESOURCE = KIND_RESOURCE["reward"]


class RewardPool(AdaptiveCore):
    def __init__(self, scheduler: str, run_dir: Path, policy: RewardPoolPolicy) -> None:
        super().__init__(minimum=policy.min_workers, maximum=policy.max_workers,
                         wait_count=policy.wait_count)
        self.scheduler, self.run_dir, self.policy = scheduler, Path(run_dir), policy
        self.client = DaskScheduler(scheduler).client(timeout=30)
        self.procs: dict[str, ManagedProcess] = {}
        self.asked: dict[str, float] = {}  # worker -> when it was asked for (not yet registered)
        self.state = {"policy": {"max_workers": policy.max_workers, "min_workers": policy.min_workers,
                                 "threads": policy.trajectories_per_worker},
                      "workers": {}, "scale_ups": [], "pending": 0, "updated": time.time()}

    # -- AdaptiveCore's state -----------------------------------------------------------
    @property
    def plan(self) -> set[str]:
        return set(self.procs)

    @property
    def requested(self) -> set[str]:
        return {n for n, p in self.procs.items() if p.running()}

    @property
    def observed(self) -> set[str]:
        return {n for n in self._registered() if n in self.procs}

    def _registered(self) -> set[str]:
        workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
        return {str(w.get("name")) for w in workers if RESOURCE in (w.get("resources") or {})}

    async def target(self) -> int:
        def pending(dask_scheduler, resource=RESOURCE) -> int:  # runs on the scheduler
            return sum(1 for ts in dask_scheduler.tasks.values()
                       if resource in (ts.resource_restrictions or {})
                       and ts.state in ("no-worker", "queued", "waiting", "processing"))

        n = self.client.run_on_scheduler(pending)
        self.state["pending"] = n
        return self.policy.target(n)

    async def workers_to_close(self, target: int) -> list[str]:
        """The newest workers go first (the oldest are warm)."""
        names = sorted(self.observed, key=lambda n: int(n.rsplit("-", 1)[1]))
        return names[target:]

    async def scale_up(self, n: int) -> None:
        now = time.time()
        for _ in range(max(0, n - len(self.procs))):
            name = next(f"reward-{i}" for i in itertools.count() if f"reward-{i}" not in self.procs)
            spec = WorkerSpec(name, "reward", self.policy.trajectories_per_worker)
            self.procs[name] = start_worker(spec, self.scheduler, self.run_dir, {}, new_session=False)
            self.asked[name] = now

    async def scale_down(self, workers: Iterable[str]) -> None:
        workers = [w for w in workers if w in self.procs]
        if workers:
            self.client.retire_workers(names=workers, close_workers=True)
        for name in workers:
            self.procs.pop(name).stop(grace=5)
            self.asked.pop(name, None)
            self._mark_down(name)

    # -- the record -----------------------------------------------------------------------
    def _mark_down(self, name: str) -> None:
        spans = self.state["workers"].get(name) or []
        if spans and spans[-1][1] is None:
            spans[-1][1] = time.time()

    def observe(self) -> None:
        """Note workers that registered (up) or died (down) since the last look."""
        now, registered = time.time(), self._registered()
        for name in list(self.asked):
            if name in registered:
                self.state["scale_ups"].append([self.asked.pop(name), now])
                self.state["workers"].setdefault(name, []).append([now, None])
        for name, proc in list(self.procs.items()):
            if not proc.running():  # died on its own: forget it, the target starts another
                self.procs.pop(name)
                self.asked.pop(name, None)
                self._mark_down(name)
        self.state["updated"] = now
        write_atomic(self.run_dir / STATE_FILE, json.dumps(self.state))

    def retire_strays(self) -> None:
        """Reward workers a previous controller started (it died): retired, so that what runs is ours."""
        strays = sorted(self._registered() - set(self.procs))
        if strays:
            self.client.retire_workers(names=strays, close_workers=True)

    async def run(self, stopping) -> None:
        self.retire_strays()
        while not stopping():
            await self.adapt()
            self.observe()
            await asyncio.sleep(INTERVAL_S)

    def close(self) -> None:
        for name in list(self.procs):
            self.procs.pop(name).stop(grace=5)
            self._mark_down(name)
        self.state["updated"] = time.time()
        write_atomic(self.run_dir / STATE_FILE, json.dumps(self.state))
        self.client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rose.stack.reward_pool")
    ap.add_argument("--scheduler", required=True)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--max-workers", required=True, type=int)
    ap.add_argument("--min-workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args(argv)
    try:
        policy = RewardPoolPolicy(args.max_workers, args.min_workers, args.threads)
    except ValueError as e:
        print(f"reward pool: {e}", file=sys.stderr)
        return 2
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    pool = RewardPool(args.scheduler, args.run_dir, policy)
    try:
        asyncio.run(pool.run(lambda: stop["now"]))
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
