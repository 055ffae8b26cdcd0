"""What serving saw over a window of time (an RL step): requests, P99 latencies, SLO attainment.

The serving side logs every finished request (finish time, TTFT, TPOT, tokens, ok); a step
report reads the log from the step's start on. Attainment counts a failed or aborted request
as a miss, and a one-token reply meets the TPOT SLO (it has no inter-token time).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ServedRequest:
    finished_at: float  # time.monotonic()
    ttft_s: float
    tpot_s: float  # nan with fewer than 2 output tokens
    output_tokens: int
    ok: bool  # finished "stop" or "length" (not aborted)


class ServingLog:
    """Bounded log of finished serving requests (the newest `capacity` are kept)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._log: deque[ServedRequest] = deque(maxlen=capacity)

    def add(self, request: ServedRequest) -> None:
        self._log.append(request)

    def since(self, t: float) -> list[ServedRequest]:
        return [r for r in self._log if r.finished_at >= t]


def window_report(requests: list[ServedRequest], ttft_slo_s: float, tpot_slo_s: float) -> dict:
    """requests, ok, P99 TTFT/TPOT over ok requests, attainment of both SLOs over all."""
    ok = [r for r in requests if r.ok]
    ttft = [r.ttft_s for r in ok]
    tpot = [r.tpot_s for r in ok if r.output_tokens > 1 and not math.isnan(r.tpot_s)]
    met = sum(r.ok and r.ttft_s <= ttft_slo_s and (r.output_tokens < 2 or r.tpot_s <= tpot_slo_s)
              for r in requests)
    return {
        "requests": len(requests), "failed": len(requests) - len(ok),
        "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft else None,
        "tpot_p99_s": float(np.percentile(tpot, 99)) if tpot else None,
        "slo_ttft_s": ttft_slo_s, "slo_tpot_s": tpot_slo_s,
        "slo_met": int(met), "slo_attainment": met / len(requests) if requests else None,
    }
