"""A per-step latency around any environment, for benchmarks of slow environments.

RollArt's environments take seconds per step (containers, tools, simulators); ours take
microseconds. `DelayedEnv` sleeps before each step for a duration drawn per step from a
distribution, so the rollout sees the same steps, only slower.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from envs.base import MultiTurnEnv, StepResult

DISTRIBUTIONS = ("normal",)


@dataclass(frozen=True)
class StepLatency:
    """Seconds each step sleeps: `normal` draws N(mean_s, std_s), clipped at 0."""

    dist: str = "normal"
    mean_s: float = 0.0
    std_s: float = 0.0

    def __post_init__(self) -> None:
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(f"step latency dist {self.dist!r} is not one of {list(DISTRIBUTIONS)}")
        for key in ("mean_s", "std_s"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"step latency {key} must be a finite number >= 0, got {value}")

    def draw(self, rng: np.random.Generator) -> float:
        return max(0.0, float(rng.normal(self.mean_s, self.std_s)))


class DelayedEnv(MultiTurnEnv):
    """`inner`, each step delayed by a draw from `latency`; everything else is the inner env's."""

    blocking = True  # its steps sleep: stepped off the scheduler's thread

    def __init__(self, inner: MultiTurnEnv, latency: StepLatency, rng: np.random.Generator | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        # no super().__init__: the episode state (turn, done) is the inner env's
        self.inner, self.latency = inner, latency
        self.name, self.system_prompt, self.max_turns = inner.name, inner.system_prompt, inner.max_turns
        self.rng = rng if rng is not None else np.random.default_rng()  # unseeded: trajectories differ
        self.sleep = sleep
        self.delays: list[float] = []  # this episode's, in order

    @property
    def turn(self) -> int:
        return self.inner.turn

    @property
    def done(self) -> bool:
        return self.inner.done

    def reset(self, seed: int) -> str:
        self.delays = []
        return self.inner.reset(seed)

    def step(self, reply: str) -> StepResult:
        delay = self.latency.draw(self.rng)
        self.delays.append(delay)
        if delay > 0:
            self.sleep(delay)
        return self.inner.step(reply)

    def expert_reply(self) -> str:
        return self.inner.expert_reply()
