"""Prometheus metrics of one serving endpoint: its own request counters and latency histograms,
plus every numeric value of the co-serving executor's `metrics()` read at scrape time
(rollout tokens, admissions, cuts, stalls, ...), so nothing is counted twice or goes stale.

Each endpoint has its own registry: several endpoints (tests, one process per worker) never
collide in prometheus_client's global one.
"""
from __future__ import annotations

import math
import re
from typing import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

# Seconds; wide on purpose: CPU runs are ~10x slower than the paper's GPU SLOs.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


def _flatten(prefix: str, value, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}_{key}" if prefix else str(key), sub, out)
    elif isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
        out[prefix] = float(value)


class ExecutorCollector:
    """Exports executor.metrics() as gauges named rose_coserving_<key> (nested keys joined)."""

    def __init__(self, executor) -> None:
        self.executor = executor

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            raw = self.executor.metrics()
        except Exception:  # a scrape must never fail because the executor is busy or closing
            return
        flat: dict[str, float] = {}
        _flatten("", raw, flat)
        for key, value in sorted(flat.items()):
            name = "rose_coserving_" + re.sub(r"[^a-zA-Z0-9_]", "_", key).strip("_")
            yield GaugeMetricFamily(name, f"co-serving executor metric '{key}'", value=value)


class EndpointMetrics:
    def __init__(self, executor=None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("rose_serving_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("rose_serving_prompt_tokens", "prompt tokens served", registry=r)
        self.generation_tokens = Counter("rose_serving_generation_tokens",
                                         "tokens generated for serving requests", registry=r)
        self.ttft = Histogram("rose_serving_ttft_seconds", "time to first token (engine side)",
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("rose_serving_tpot_seconds", "time per output token after the first",
                              buckets=TPOT_BUCKETS, registry=r)
        self.yielded_to_users = Counter("rose_serving_rollout_yielded",
                                        "users the rollout side yielded to (admitted, not refused)",
                                        registry=r)
        if executor is not None:
            r.register(ExecutorCollector(executor))
        self.content_type = CONTENT_TYPE_LATEST

    def count(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(status)).inc()

    def observe(self, route: str, status: int, result, n_prompt: int, n_out: int) -> None:
        self.count(route, status)
        self.prompt_tokens.inc(n_prompt)
        self.generation_tokens.inc(n_out)
        for hist, attr in ((self.ttft, "ttft_s"), (self.tpot, "tpot_s")):
            value = getattr(result, attr, None) if result is not None else None
            if value is not None and math.isfinite(value) and value >= 0:
                hist.observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
