"""The elastic reward pool: how many reward workers to run, and how well they were used.

Rewards are scored per trajectory, as soon as it ends, by a pool of CPU workers shared by every
run on the stack (RollArt's serverless reward). The pool follows its queue: `target(pending)`
asks for one worker per `trajectories_per_worker` trajectories waiting or being scored, between
`min_workers` (0: none while idle) and `max_workers`. Dask's AdaptiveCore (rose/stack/reward_pool.py)
applies it, scaling down only after the target stayed lower `wait_count` times in a row.

`PoolUsage` turns the pool's record (when each worker was up, when each trajectory was
submitted, started and finished) into the figures an operator asks for: worker utilization
(busy seconds over the seconds workers were up), queueing time, scale-up delay.
Plain Python; callers pass the times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RewardPoolPolicy:
    max_workers: int  # the cap (stack.reward_workers)
    min_workers: int = 0  # kept up while idle (0: the pool empties)
    trajectories_per_worker: int = 4  # scored at once by one worker (its threads)
    wait_count: int = 6  # lower targets in a row before a worker is retired

    def __post_init__(self) -> None:
        if self.max_workers < 1:
            raise ValueError(f"reward pool max_workers must be >= 1, got {self.max_workers}")
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError(f"reward pool min_workers must be in 0..max_workers ({self.max_workers}), "
                             f"got {self.min_workers}")
        if self.trajectories_per_worker < 1:
            raise ValueError(f"trajectories_per_worker must be >= 1, got {self.trajectories_per_worker}")
        if self.wait_count < 1:
            raise ValueError(f"wait_count must be >= 1, got {self.wait_count}")

    def target(self, pending: int) -> int:
        """Workers wanted for `pending` trajectories (queued or being scored)."""
        if pending < 0:
            raise ValueError(f"pending trajectories must be >= 0, got {pending}")
        want = math.ceil(pending / self.trajectories_per_worker)
        return max(self.min_workers, min(self.max_workers, want))


@dataclass(frozen=True)
class Scored:
    """One trajectory's trip through the pool (wall-clock seconds, any common epoch)."""

    worker: str
    submitted: float
    started: float
    finished: float


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


@dataclass
class PoolUsage:
    """The pool over a window [t0, t1]: `up` maps each worker to its (up, down) spans (down
    None: still up), `scored` what it scored, `scale_ups` (asked, registered) times."""

    t0: float
    t1: float
    up: dict[str, list[tuple[float, float | None]]]
    scored: list[Scored]
    scale_ups: list[tuple[float, float]]

    def __post_init__(self) -> None:
        if not self.t1 >= self.t0:
            raise ValueError(f"window ends ({self.t1}) before it starts ({self.t0})")

    def worker_seconds(self) -> float:
        return sum(_overlap(a, self.t1 if b is None else b, self.t0, self.t1)
                   for spans in self.up.values() for a, b in spans)

    def busy_seconds(self) -> float:
        return sum(_overlap(s.started, s.finished, self.t0, self.t1) for s in self.scored)

    def summary(self, threads: int = 1) -> dict:
        waits = sorted(s.started - s.submitted for s in self.scored)
        delays = sorted(b - a for a, b in self.scale_ups if self.t0 <= a <= self.t1)
        up = self.worker_seconds()
        return {
            "trajectories": len(self.scored),
            "worker_seconds": up,
            "busy_seconds": self.busy_seconds(),
            # a worker scores `threads` trajectories at once: its capacity is threads x its time up
            "utilization": None if up <= 0 else min(1.0, self.busy_seconds() / (up * threads)),
            "queue_s_mean": sum(waits) / len(waits) if waits else None,
            "queue_s_max": waits[-1] if waits else None,
            "scale_ups": len(delays),
            "scale_up_s_max": delays[-1] if delays else None,
            "peak_workers": self.peak_workers(),
        }

    def peak_workers(self) -> int:
        """The most workers up at once inside the window."""
        spans = [(a, math.inf if b is None else b) for ss in self.up.values() for a, b in ss]
        points = [self.t0] + [a for a, _ in spans if self.t0 <= a <= self.t1]
        return max((sum(a <= p < b for a, b in spans) for p in points), default=0)
