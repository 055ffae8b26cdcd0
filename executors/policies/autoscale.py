"""The evict/reload autoscaling baseline's trigger: plain logic, the co-serving executor acts.

A burst (serving load >= threshold) evicts the rollout model at once; it comes back after the
load has stayed <= threshold // 2 for calm_s. tick() says what to do now.
"""
from __future__ import annotations


class EvictReload:
    """When to evict the rollout model for a serving burst, and when to bring it back."""

    def __init__(self, threshold: int, calm_s: float) -> None:
        self.threshold, self.calm_s = threshold, calm_s
        self.calm_since: float | None = None
        self.evictions = 0
        self.reload_s: list[float] = []

    def tick(self, load: int, rollout_up: bool, now: float) -> str | None:
        if rollout_up and load >= self.threshold:
            self.calm_since = None
            self.evictions += 1
            return "evict"
        if rollout_up or load > self.threshold // 2:
            self.calm_since = None
            return None
        if self.calm_since is None:
            self.calm_since = now
        if now - self.calm_since >= self.calm_s:
            self.calm_since = None
            return "reload"
        return None
