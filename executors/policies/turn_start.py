"""Whether a co-serving worker starts a rollout turn now, or hands it back unstarted.

A turn started where serving leaves no slack stalls, and the stall detector aborts it after its
prefix was paid for. Handing it back before anything ran costs nothing: the scheduler places it
elsewhere. So the executor records, every loop iteration, whether admission would have run a
rollout step then (`observe`), and starts a turn only if, at the share of recent time it could
run (f), the turn's own work (`work_s`, its steps priced by the rollout profile) finishes within
max(stall timeout, 2 x work_s), and no closed gap in the window was as long as the stall timeout
(a turn started into such a gap stalls). With no history yet it starts: only running says.
Plain Python; callers pass `now`.
"""
from __future__ import annotations

import math
from collections import deque


class TurnStartGate:
    def __init__(self, stall_timeout_s: float, window_s: float | None = None) -> None:
        if not (math.isfinite(stall_timeout_s) and stall_timeout_s > 0):
            raise ValueError(f"stall timeout must be a positive number of seconds, got {stall_timeout_s}")
        self.stall_timeout_s = stall_timeout_s
        self.window_s = 2 * stall_timeout_s if window_s is None else window_s
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window must be a positive number of seconds, got {window_s}")
        self._spans: deque[tuple[float, float, bool]] = deque()  # (from, to, could run)
        self._last: tuple[float, bool] | None = None

    def observe(self, now: float, could_run: bool) -> None:
        """Whether a rollout step could have run at `now` (admission's answer)."""
        if self._last is not None and now > self._last[0]:
            t0, was = self._last
            if self._spans and self._spans[-1][2] == was and self._spans[-1][1] == t0:
                self._spans[-1] = (self._spans[-1][0], now, was)  # extend the run
            else:
                self._spans.append((t0, now, was))
        self._last = (now, could_run)
        while self._spans and self._spans[0][1] < now - self.window_s:
            self._spans.popleft()

    def forget(self) -> None:
        """Drop the history: the rollout engine was down (parked or evicted), and that time says
        nothing about the slack serving leaves it now (a closed span before it went down would
        otherwise look as long as the whole time it was down)."""
        self._spans.clear()
        self._last = None

    def open_share(self, now: float) -> float | None:
        """The share of the window's recorded time a step could run (None: nothing recorded)."""
        lo = now - self.window_s
        total = run = 0.0
        for a, b, ok in self._spans:
            d = max(0.0, b - max(a, lo))
            total += d
            run += d if ok else 0.0
        return None if total <= 0 else run / total

    def longest_closed_s(self, now: float) -> float:
        """The longest span in the window when no step could run (the open one included)."""
        longest = max((b - a for a, b, ok in self._spans if not ok), default=0.0)
        if self._last is not None and not self._last[1]:
            start = self._last[0]
            for a, b, ok in reversed(self._spans):  # a closed run still going on
                if ok or b != start:
                    break
                start = a
            longest = max(longest, now - start)
        return longest

    def predicted_s(self, now: float, work_s: float) -> float:
        """Seconds a turn of `work_s` seconds of steps takes at the recent open share."""
        f = self.open_share(now)
        if f is None:
            return work_s
        return math.inf if f <= 0 else work_s / f

    def should_start(self, now: float, work_s: float) -> bool:
        """Whether a turn of `work_s` seconds of steps would finish (see the module's rule)."""
        if not (math.isfinite(work_s) and work_s >= 0):
            raise ValueError(f"turn work must be finite seconds >= 0, got {work_s}")
        return (self.longest_closed_s(now) < self.stall_timeout_s
                and self.predicted_s(now, work_s) <= max(self.stall_timeout_s, 2 * work_s))
