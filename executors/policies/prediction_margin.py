"""The margin admission keeps: a high quantile of how far steps overran their prediction.

Admission holds a rollout step's predicted cost against serving's slack; a prediction is a
median (the profile's) scaled by the measured slowdown, so about half of the steps run longer.
The slack must absorb the overrun of the P99 step, not the mean one, so every slack is reduced
by the `quantile` of recent overruns (took - predicted, seconds, >= 0), measured on this device
in this run. Plain Python: callers pass both times.
"""
from __future__ import annotations

import math
from collections import deque


class PredictionMargin:
    def __init__(self, quantile: float = 0.99, window: int = 512, min_samples: int = 20) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"margin quantile must be in (0, 1), got {quantile}")
        if window < 1 or min_samples < 1:
            raise ValueError(f"window and min_samples must be >= 1, got {window}, {min_samples}")
        self.quantile, self.min_samples = quantile, min_samples
        self._overruns: deque[float] = deque(maxlen=window)
        self._sorted: list[float] | None = None

    def __len__(self) -> int:
        return len(self._overruns)

    def observe(self, predicted_s: float, took_s: float) -> None:
        """One step ran: it was predicted to take `predicted_s` and took `took_s`."""
        if not (math.isfinite(predicted_s) and math.isfinite(took_s)) or took_s < 0:
            raise ValueError(f"step times must be finite, got {predicted_s}, {took_s}")
        self._overruns.append(max(0.0, took_s - predicted_s))
        self._sorted = None

    def margin_s(self) -> float:
        """The quantile of recent overruns; 0 until `min_samples` steps were seen."""
        if len(self._overruns) < self.min_samples:
            return 0.0
        if self._sorted is None:
            self._sorted = sorted(self._overruns)
        xs = self._sorted
        return xs[min(len(xs) - 1, math.ceil(self.quantile * len(xs)) - 1)]
