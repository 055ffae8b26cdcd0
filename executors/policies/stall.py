"""Stall detection for rollout requests on a co-serving executor.

A rollout request that makes no progress (no prefill chunk, no token) for `timeout_s` is
reported once and forgotten here, so the scheduler can reroute its trajectory (paper
4.1: default 2 s). Waiting for admission counts as no progress: that is exactly the
case a serving burst causes. Nothing reads a clock: callers pass `now`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable


@dataclass(frozen=True)
class StallReport:
    request_id: Hashable
    trajectory_id: Hashable
    idle_s: float


@dataclass
class _Watch:
    trajectory_id: Hashable
    last_progress: float


class StallDetector:
    def __init__(self, timeout_s: float = 2.0) -> None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"stall timeout must be a positive number of seconds, got {timeout_s}")
        self.timeout_s = timeout_s
        self._watch: dict[Hashable, _Watch] = {}

    def __len__(self) -> int:
        return len(self._watch)

    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._watch

    def on_admit(self, request_id: Hashable, now: float, trajectory_id: Hashable | None = None) -> None:
        """Start watching a request the executor accepted (the clock starts now)."""
        if request_id in self._watch:
            raise ValueError(f"rollout request {request_id!r} is already being watched")
        tid = request_id if trajectory_id is None else trajectory_id
        self._watch[request_id] = _Watch(tid, now)

    def on_progress(self, request_id: Hashable, now: float) -> bool:
        """The request advanced. False for an unknown id (already finished or reported stalled:
        a late event after the drop must not resurrect it)."""
        w = self._watch.get(request_id)
        if w is None:
            return False
        w.last_progress = max(w.last_progress, now)
        return True

    def on_finish(self, request_id: Hashable) -> None:
        self._watch.pop(request_id, None)

    def oldest_progress(self) -> float:
        """The earliest last progress of the requests watched (+inf: none): nothing is reported
        while now - this < timeout_s."""
        return min((w.last_progress for w in self._watch.values()), default=math.inf)

    def check(self, now: float) -> list[StallReport]:
        """Requests idle for >= timeout_s, longest idle first; each is reported once and dropped."""
        stalled = sorted(((rid, w) for rid, w in self._watch.items()
                          if now - w.last_progress >= self.timeout_s),
                         key=lambda kv: kv[1].last_progress)
        for rid, _ in stalled:
            del self._watch[rid]
        return [StallReport(rid, w.trajectory_id, now - w.last_progress) for rid, w in stalled]


def keep_stalled(started: bool, times_kept: int, since_slack_denial_s: float, timeout_s: float,
                 max_keeps: int = 4) -> bool:
    """Whether a stalled rollout turn is kept (its KV held; it resumes when serving's burst
    passes) instead of aborted: only a turn that has started (aborting it throws its work away),
    that admission denied for serving slack within the stall window (not stuck on KV, which
    would never clear), and that was kept fewer than max_keeps times already."""
    return started and times_kept < max_keeps and since_slack_denial_s < timeout_s
