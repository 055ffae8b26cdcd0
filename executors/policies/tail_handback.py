"""Tail hand-back: borrowed turns that wait while dedicated rollout GPUs sit idle come home.

At the end of a rollout phase the dedicated GPUs run out of work while a few turns still sit on
borrowed serving GPUs: queued behind admission during a serving burst, or advancing slowly
between serving requests. The step waits for its slowest trajectory, so one such turn can
stretch the whole phase to the stall timeout (the cluster simulator showed ROSE's rollout phase
doubling at 256+ GPUs this way). When nothing is queued and a dedicated GPU has a free slot, a
borrowed turn out for longer than `factor` times the dedicated GPUs' median turn time is
aborted where it is and rerouted: a dedicated GPU re-prefills it from the trajectory's history,
which costs one ordinary turn. Each turn (trajectory, turn index) is handed back at most once,
so none ping-pongs or spends its reroute attempts here. Plain Python: callers pass the times.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Hashable


@dataclass(frozen=True)
class HandbackConfig:
    factor: float = 4.0  # out this many dedicated median turn times before it is handed back
    min_wait_s: float = 0.05  # never sooner: a turn just sent has not had a chance yet
    window: int = 64  # dedicated turn times the median is taken over (the latest ones)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"hand-back factor must be >= 1, got {self.factor}")
        if not (math.isfinite(self.min_wait_s) and self.min_wait_s >= 0):
            raise ValueError(f"hand-back min_wait_s must be >= 0, got {self.min_wait_s}")
        if self.window < 1:
            raise ValueError(f"hand-back window must be >= 1, got {self.window}")


class TailHandback:
    def __init__(self, config: HandbackConfig | None = None) -> None:
        self.config = config or HandbackConfig()
        self._recent: deque[float] = deque(maxlen=self.config.window)
        self._handed: set[Hashable] = set()

    def on_dedicated_turn(self, seconds: float) -> None:
        """A turn finished on a dedicated rollout GPU after `seconds` (sent to answered)."""
        if math.isfinite(seconds) and seconds >= 0:
            self._recent.append(seconds)

    def threshold_s(self) -> float | None:
        """How long a borrowed turn may be out before it is due; None until a dedicated turn ended."""
        if not self._recent:
            return None
        return max(self.config.min_wait_s, self.config.factor * statistics.median(self._recent))

    def handed_back(self, key: Hashable) -> bool:
        """Whether turn `key` was handed back already (each is, at most once)."""
        return key in self._handed

    def due(self, borrowed: dict[Hashable, float], free_dedicated_slots: int, queued: int,
            now: float) -> list[Hashable]:
        """The turns to hand back now, oldest first. borrowed: turn key -> when it was sent to its
        serving GPU. Only while nothing waits in the queue (queued turns take free slots first)."""
        limit = self.threshold_s()
        if limit is None or queued > 0 or free_dedicated_slots <= 0:
            return []
        old = sorted((sent, key) for key, sent in borrowed.items()
                     if key not in self._handed and now - sent >= limit)
        chosen = [key for _, key in old[:free_dedicated_slots]]
        self._handed.update(chosen)
        return chosen
