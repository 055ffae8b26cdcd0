"""A serving worker's KV memory over one RL step, small enough to ride in its step report.

Samples (the most KV blocks serving and rollout held since the last sample, the rollout budget,
admission decisions since the last sample) at most every `every_s`, and events as they happen:
`burst` (serving's usage crossed the burst watermark going up, or a cut fired), `cut` (the policy
cut the rollout budget), `freeze` (the cut's aborts are freed: no budget growth until the next
step), `lease_reclaim` (leased rollout prefixes freed: expired, reclaimed for room or dropped by
a cut), `evict` / `reload` (the evict/reload baseline's rollout engine). Bounded: past
`max_samples` the samples are thinned by half and the interval doubled (the whole step stays
covered), past `max_events` events are counted, not kept.

Lives on the executor's loop thread (executors/coserving/memory.py ticks it every iteration):
between samples a tick is a few attribute reads.
"""
from __future__ import annotations

import time

from executors.policies.kv_memory import MemoryState

LEASE_COUNTERS = ("leases_expired", "leases_reclaimed", "prefixes_dropped")


class KVTimeline:
    def __init__(self, every_s: float = 0.5, max_samples: int = 240, max_events: int = 200):
        self.base_every_s, self.max_samples, self.max_events = every_s, max_samples, max_events
        self.start(time.monotonic())

    def start(self, now: float) -> None:
        """A new step's window: the old samples and events go."""
        self.started, self.started_wall = now, time.time() - (time.monotonic() - now)
        self.every_s, self.last_at = self.base_every_s, -float("inf")
        self.samples: list[list] = []
        self.events: list[list] = []
        self.dropped_events = 0
        self._above = self._frozen = False
        self._cuts = self._leases = self._decisions = None
        self._aborted = 0
        self._peak = (0, 0)  # the most KV blocks serving and rollout held since the last sample
        self._up: bool | None = None

    def tick(self, ex, now: float) -> None:
        """Called every loop iteration with the executor (CoServingExecutor)."""
        p, up = ex.policy, ex.rollout is not None
        if p is not None:  # peaks between samples: a short serving request is seen too
            self._peak = (max(self._peak[0], p.serving_used), max(self._peak[1], p.rollout_used))
            # A cut lowers the budget and so raises the watermark in the same policy call: by
            # now serving may be under it again, so a cut counts as the burst that fired it.
            cut = self._cuts is not None and p.cuts > self._cuts
            above = p.serving_used >= p.watermark_blocks
            if cut or (above and not self._above):
                self._event(ex, now, "burst")
            if cut:  # count: the turns it aborted
                self._event(ex, now, "cut", p.aborted_total - self._aborted)
            self._above, self._cuts, self._aborted = above, p.cuts, p.aborted_total
            frozen = p.state is MemoryState.FROZEN
            if frozen and not self._frozen:
                self._event(ex, now, "freeze")
            self._frozen = frozen
        if self._up is not None and up != self._up:
            self._event(ex, now, "reload" if up else "evict")
        self._up = up
        if now - self.last_at >= self.every_s:
            self._sample(ex, now)

    def _blocks(self, ex) -> tuple[int, int, int | None]:
        """Serving, rollout blocks (in serving pages, the policy's unit) and the rollout budget."""
        p = ex.policy
        if p is not None:
            return p.serving_used, p.rollout_used, p.budget
        rollout = ex.rollout.used_blocks() * ex.page_ratio if ex.rollout is not None else 0
        return ex.serving.used_blocks(), round(rollout), None

    def _sample(self, ex, now: float) -> None:
        self.last_at = now
        r = ex.rollout_counters
        leases = sum(r.get(k, 0) for k in LEASE_COUNTERS)
        if self._leases is not None and leases > self._leases:
            self._event(ex, now, "lease_reclaim", leases - self._leases)
        self._leases = leases
        admitted, denied = ex.counters["admitted"], sum(ex.counters["denied"].values())
        last = self._decisions or (admitted, denied)
        self._decisions = admitted, denied
        serving, rollout, budget = self._blocks(ex)
        serving, rollout = max(serving, self._peak[0]), max(rollout, self._peak[1])
        self._peak = (0, 0)
        self.samples.append([round(now - self.started, 3), serving, rollout, budget,
                             admitted - last[0], denied - last[1]])
        if len(self.samples) > self.max_samples:  # keep the whole step: half the points
            self.samples = thinned(self.samples)
            self.every_s *= 2

    def _event(self, ex, now: float, kind: str, count: int | None = None) -> None:
        if len(self.events) >= self.max_events:
            self.dropped_events += 1
            return
        self.events.append([round(now - self.started, 3), kind, *self._blocks(ex), count])

    def report(self, ex, now: float) -> dict:
        """The step so far: a last sample taken now, columns as lists (plain JSON)."""
        self._sample(ex, now)
        p = ex.policy
        return {"started_at": self.started_wall, "every_s": self.every_s,
                "total_blocks": p.total_blocks if p is not None else ex.total,
                "reserve_blocks": p.reserve_blocks if p is not None else None,
                "samples": [list(s) for s in self.samples],
                "events": [list(e) for e in self.events], "dropped_events": self.dropped_events}


def thinned(samples: list[list]) -> list[list]:
    """Every second sample, each carrying the admission counts and peaks of the one dropped
    before it (both are per interval since the previous sample: none is lost)."""
    out = [[b[0], max(a[1], b[1]), max(a[2], b[2]), b[3], a[4] + b[4], a[5] + b[5]]
           for a, b in zip(samples[::2], samples[1::2])]
    return out + samples[-1:] if len(samples) % 2 else out
