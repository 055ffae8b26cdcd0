"""The margin admission keeps: a high quantile of how much longer rollout steps ran than predicted.

Admission holds a rollout step's predicted cost against serving's slack; a prediction is the
profile's median scaled by the measured slowdown (a mean), so about half of the steps run
longer. What must fit the slack is the P99 step, not the mean one: so the cost admission holds
is the prediction times the `quantile` of recent ratios took / predicted (>= 1), measured on
this device in this run. A ratio, not seconds, because the overrun grows with the step: a small
decode step keeps a small margin, a full prefill chunk a large one, and steps sized to the slack
(step_plan.smaller_steps) shrink until they fit with theirs. Noise every step on this device
suffers (a page fault, the OS taking the core) is serving alone's too, already inside an SLO
derived from serving alone: so the factor is taken relative to the serving steps' own tail
(`relative_to`), i.e. only the overrun that rollout steps have beyond serving's.
Plain Python: callers pass both times.
"""
from __future__ import annotations

import math
from collections import deque


def nearest_rank(xs: list[float], q: float) -> float:
    """The q-quantile of the sorted, non-empty `xs` (nearest rank: a value that occurred)."""
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


class PredictionMargin:
    def __init__(self, quantile: float = 0.99, window: int = 512, min_samples: int = 20) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"margin quantile must be in (0, 1), got {quantile}")
        if window < 1 or min_samples < 1:
            raise ValueError(f"window and min_samples must be >= 1, got {window}, {min_samples}")
        self.quantile, self.min_samples = quantile, min_samples
        self._ratios: deque[float] = deque(maxlen=window)
        self._factor: float | None = None

    def __len__(self) -> int:
        return len(self._ratios)

    def observe(self, predicted_s: float, took_s: float) -> None:
        """One rollout step ran: it was predicted to take `predicted_s` and took `took_s`."""
        if not (math.isfinite(predicted_s) and math.isfinite(took_s)) or predicted_s <= 0 or took_s < 0:
            raise ValueError(f"step times must be finite (prediction > 0), got {predicted_s}, {took_s}")
        self._ratios.append(took_s / predicted_s)
        self._factor = None

    def tail(self) -> float | None:
        """The quantile of recent took / predicted ratios; None until `min_samples`."""
        if len(self._ratios) < self.min_samples:
            return None
        if self._factor is None:
            self._factor = nearest_rank(sorted(self._ratios), self.quantile)
        return self._factor

    def factor(self, relative_to: "PredictionMargin | None" = None) -> float:
        """The tail ratio (at least 1; 1 until `min_samples`); with `relative_to`, divided by its
        tail (the overrun beyond what those steps see too), and 1 while it has none yet (no
        serving steps to compare with: the SLO derived from serving alone holds its noise)."""
        mine = self.tail()
        if mine is None:
            return 1.0
        if relative_to is None:
            return max(1.0, mine)
        base = relative_to.tail()
        return 1.0 if base is None else max(1.0, mine / base)
