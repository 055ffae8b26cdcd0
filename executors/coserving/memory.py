"""The co-serving executor's KV memory over time: serving usage, the KV policy, evict/reload.

A mixin of CoServingExecutor (executors/coserving/executor.py), run on its loop thread: it
samples serving's block usage (the next RL step's rollout budget comes from its recent peak),
feeds the KV memory policy and carries out its emergency cuts and lease expiries, and, in the
evict/reload baseline, drops or rebuilds the whole rollout engine (executors/policies/autoscale.py
says when); a parked engine is rebuilt the same way (parking.py).
"""
from __future__ import annotations

import time

from executors.coserving.engines import open_engine, shutdown_rollout


class MemoryWatch:
    """Usage samples, policy observations and the evict/reload baseline's actions."""

    def _watch_memory(self, now: float) -> None:
        used = self.serving.used_blocks()
        if not self._usage or used > self._usage[-1][1] or now - self._usage[-1][0] >= 0.1:
            self._usage.append((now, used))
            while self._usage and now - self._usage[0][0] > self.cfg.usage_window_s:
                self._usage.popleft()
        if self.policy is not None and self.rollout is not None:
            actions = self.policy.observe_serving(min(used, self.total), now)
            if actions:
                self.rollout.apply(actions)
            self.rollout.expire_leases(now)
        if self.wiring.evict_on_burst and not self.parking["parked"]:  # parked: no run to reload for
            self._autoscale(now)
        self.timeline.tick(self, now)  # events as they happen, samples every ~0.5 s

    def _do_start_step(self) -> None:
        now = time.monotonic()
        peak = max([u for _, u in self._usage] + [self.serving.used_blocks()])
        if self.policy is not None:
            self.policy.start_step(min(peak, self.total), now)
        self.counters["start_steps"] += 1
        self.timeline.start(now)

    def kv_timeline(self) -> dict:
        """KV blocks and memory events since the step started (KVTimeline.report); any thread."""
        return self._call(lambda: self.timeline.report(self, time.monotonic()))

    def _autoscale(self, now: float) -> None:
        act = self.autoscale.tick(len(self.serving.live), self.rollout is not None, now)
        if act == "evict":
            self.rollout.abort(list(self.rollout.live), "evict")
            shutdown_rollout(self.rollout)
            self.rollout = None
        elif act == "reload":
            t0 = time.perf_counter()  # the real cost: engine build + warm-up + weights
            self._rebuild_rollout()
            if self._weights is not None:
                self._load_weights(*self._weights)
            self.rollout.version = self.version
            self.autoscale.reload_s.append(time.perf_counter() - t0)

    def _rebuild_rollout(self) -> None:
        """A rollout engine again (evicted or parked): its profile is read from the cache."""
        engine, sched, _, _ = open_engine(self.cfg, "rollout")
        self.rollout = self._rollout_side(engine, sched)
        self.turn_gate.forget()
