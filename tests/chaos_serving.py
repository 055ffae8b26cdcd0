"""Serving users during a chaos run: the code-trace replay (replay/background.py) against
the stack's endpoints while the run trains, and what the clients saw: requests that failed,
split into those in flight when the fault struck and those sent after it."""
from __future__ import annotations

import math
import time

from tests.chaos_stack import Bed


class ServingLoad:
    """`with ServingLoad(bed): train...`; then `report(fault_at)`."""

    def __init__(self, bed: Bed) -> None:
        from replay.background import BackgroundReplay, BackgroundTraffic

        endpoints = list(bed.stack().get("endpoints", {}).values())
        # denser than the demo's replay (sample 1.0, not 0.25): a short run must have requests
        # in flight when the fault strikes
        self.replay = BackgroundReplay(endpoints, BackgroundTraffic(sample=1.0))
        self.t0 = 0.0

    def __enter__(self) -> "ServingLoad":
        self.t0 = time.time()
        self.replay.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.replay.stop(timeout_s=180)
        except RuntimeError:
            pass  # the records tell what failed; a replay error is in report()

    def report(self, fault_at: float | None) -> dict:
        records = self.replay.records
        failed = [r for r in records if not r.ok]
        sent = lambda r: self.t0 + r.send_at_s + r.late_s  # noqa: E731 - wall clock of a send
        in_flight = [r for r in failed if fault_at is not None and sent(r) < fault_at]
        durations = [r.e2e_s for r in failed if not math.isnan(r.e2e_s)]
        # refused at once by the endpoint's SLO admission (503 + Retry-After): load shedding by
        # design (a busy machine), not the fault; counted apart
        shed = [r for r in failed if r.error.startswith("HTTP 503") and "the serving endpoint is" in r.error]
        shed_ids = {id(r) for r in shed}
        return {**downtime([(sent(r), r.e2e_s, r.ok) for r in records if id(r) not in shed_ids],
                           fault_at),
                "serving_shed": len(shed),
                "serving_requests": len(records), "serving_failed": len(failed),
                "serving_failed_in_flight": len(in_flight),
                "serving_failed_after": len(failed) - len(in_flight),
                "serving_errors": sorted({r.error[:80] for r in failed})[:5],
                "serving_failed_max_s": max(durations) if durations else None,
                "replay_error": repr(self.replay.error) if self.replay.error else None}


def downtime(requests: list[tuple[float, float, bool]], fault_at: float | None) -> dict:
    """The serving downtime a fault caused, as the users saw it: from the first request that
    failed after the fault (a request in flight then fails at the fault) to the first request
    sent after that one which was answered; the failures inside that window and outside it.
    `requests`: (wall-clock send time, seconds to its end or nan, answered)."""
    if fault_at is None:
        return {}
    ends = [(max(t, fault_at) if math.isnan(e) else t + e, ok, t) for t, e, ok in requests]
    failed = sorted(end for end, ok, _ in ends if not ok and end >= fault_at)
    if not failed:
        return {"serving_down_s": 0.0, "serving_failed_in_down": 0, "serving_failed_outside": 0}
    first_fail = failed[0]
    answered = sorted(t for _, ok, t in ends if ok and t >= first_fail)
    back = answered[0] if answered else None
    inside = sum(1 for end in failed if back is None or end <= back)
    return {"serving_down_s": None if back is None else round(back - first_fail, 1),
            "serving_failed_in_down": inside,
            "serving_failed_outside": sum(1 for end, ok, _ in ends if not ok) - inside}


def wait_answering(url: str, since: float, timeout_s: float = 300.0) -> float | None:
    """Seconds from `since` (a fault) until the endpoint's /health answers 200, polled every
    0.2 s; None when it never does within `timeout_s`."""
    import httpx

    while time.time() - since < timeout_s:
        try:
            if httpx.get(f"{url.rstrip('/')}/health", timeout=2).status_code == 200:
                return round(time.time() - since, 1)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return None


class InFlightProbes:
    """Long streaming completions held open on an endpoint, so that a fault finds requests
    in flight for certain; each records how it ended (served, or the error and when)."""

    def __init__(self, url: str, n: int = 4, max_tokens: int = 1500) -> None:
        import threading

        from replay.job import endpoint_model

        self.url, self.model = url.rstrip("/"), endpoint_model(url)["id"]
        self.max_tokens = max_tokens
        self.results: list[dict] = [{} for _ in range(n)]
        self.streaming = threading.Barrier(n + 1)
        self.threads = [threading.Thread(target=self._one, args=(i,), daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def _one(self, i: int) -> None:
        import httpx

        body = {"model": self.model, "prompt": [11 + i] * 16, "max_tokens": self.max_tokens,
                "stream": True, "ignore_eos": True, "temperature": 0.0}
        res, first = self.results[i], True
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body,
                              timeout=httpx.Timeout(120, connect=10)) as resp:
                res["status"] = resp.status_code
                for line in resp.iter_lines():
                    if first and '"choices"' in line:
                        first = False
                        self.streaming.wait(60)
            res["ok"] = res["status"] == 200
        except Exception as e:  # noqa: BLE001 - how it ended is the measurement
            res["error"] = f"{type(e).__name__}: {e}"[:120]
        finally:
            res["ended"] = time.time()
            if first:  # never streamed: do not keep the others waiting
                self.streaming.abort()

    def wait_streaming(self, timeout_s: float = 120) -> None:
        self.streaming.wait(timeout_s)

    def report(self, fault_at: float, timeout_s: float = 180) -> dict:
        for t in self.threads:
            t.join(timeout_s)
        ends = [r["ended"] - fault_at for r in self.results if "error" in r and "ended" in r]
        return {"in_flight": len(self.results),
                "in_flight_failed": sum("error" in r for r in self.results),
                "in_flight_served": sum(bool(r.get("ok")) for r in self.results),
                "in_flight_hung": sum(t.is_alive() for t in self.threads),
                "in_flight_errors": sorted({r["error"][:60] for r in self.results
                                            if "error" in r}),
                "in_flight_error_after_s": round(max(ends), 2) if ends else None}
