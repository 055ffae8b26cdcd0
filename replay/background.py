"""Serving users while a run trains: an open-loop HTTP replay of the trace against the stack's
serving endpoints, from a process of its own watched by a background thread, until the run
ends (`rose demo`, the e2e test).

Scaled as bench/coserving/coserving.py scales it (x8 faster, prompts x1/16, outputs x1) and thinned by
`sample`, because on this 2-core machine the replay, the trainer and every worker's engines
share the cores. The users run in their own process, as real users run on other machines: in
the driver's process they would wait on its interpreter lock whenever the run's own work held it,
and count that wait as the server's TTFT. The replay runs the trace from its start; a `window_s` longer than one pass
plays it again, back to back, so a long run never runs out of users. A pass is the whole trace,
or its first `period_s` trace seconds: the demo replays exactly the window it measured serving
alone on, so the run's users are held to the traffic their SLO was derived from.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import tempfile
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from replay.replayer import RequestRecord, replay_over_http, summarize
from storage.atomic import write_atomic
from replay.job import endpoint_model
from core.trace import DEFAULT_TRACE, ReplayRequest, Scaling, load_trace, plan


@dataclass(frozen=True)
class BackgroundTraffic:
    time_scale: float = 0.125
    length_scale: float = 1 / 16
    output_scale: float = 1.0
    sample: float = 0.25
    window_s: float = 3600.0  # trace seconds replayed at most (x time_scale of wall time)
    period_s: float | None = None  # trace seconds of one pass (None: the whole trace)
    seed: int = 0
    trace: Path = DEFAULT_TRACE

    def __post_init__(self) -> None:
        for name in ("time_scale", "length_scale", "output_scale", "window_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"background traffic {name} must be > 0, got {getattr(self, name)}")
        if self.period_s is not None and self.period_s <= 0:
            raise ValueError(f"background traffic period_s must be > 0, got {self.period_s}")
        if not 0 < self.sample <= 1:
            raise ValueError(f"background traffic sample must be in (0, 1], got {self.sample}")


class BackgroundReplay:
    """`with BackgroundReplay(endpoints) as traffic: train(...)`; then `traffic.summary`.
    `BackgroundReplay(endpoints, shorter).play()` replays a window in the foreground instead."""

    def __init__(self, endpoints: list[str], traffic: BackgroundTraffic = BackgroundTraffic()) -> None:
        if not endpoints:
            raise ValueError("background replay needs at least one serving endpoint")
        self.endpoints, self.traffic = list(endpoints), traffic
        self.model = endpoint_model(self.endpoints[0])  # fails now, loudly, if none answers
        self.records: list[RequestRecord] = []
        self.error: BaseException | None = None
        self._stop = _SPAWN.Event()
        self._thread = threading.Thread(target=self._run, name="rose-serving-replay", daemon=True)

    def _plan(self) -> list[ReplayRequest]:
        t, trace = self.traffic, load_trace(self.traffic.trace)
        if t.period_s is not None:
            trace = trace.window(0.0, t.period_s)
        context = int(self.model.get("max_model_len") or 2048)
        once = plan(trace, Scaling(t.time_scale, t.length_scale, t.output_scale, t.sample,
                                   context, t.seed), start_s=0.0)
        # one pass in trace seconds; without a period, the trace and a breath between passes
        span = t.period_s if t.period_s is not None else trace.span_s + 1.0 / t.time_scale
        out: list[ReplayRequest] = []
        for k in range(math.ceil(t.window_s / max(span, 1.0))):
            out += [replace(r, index=len(out) + i, send_at_s=r.send_at_s + k * span * t.time_scale)
                    for i, r in enumerate(once) if r.trace_arrival_s + k * span < t.window_s]
        return out

    def _run(self) -> None:
        try:
            self.records = _replay_in_own_process(self._plan(), self.endpoints, self.model,
                                                  self.traffic.seed, self._stop)
        except BaseException as e:  # noqa: BLE001 - reported by stop(), never kills the run
            self.error = e

    def __enter__(self) -> "BackgroundReplay":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, timeout_s: float = 120.0) -> dict:
        """No new request; wait for those in flight; the replay's summary (summarize())."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self.error is not None:
            raise RuntimeError(f"the background serving replay failed: {self.error}") from self.error
        return self.summary

    @property
    def summary(self) -> dict:
        return summarize(self.records)

    def summary_at(self, ttft_slo_s: float, tpot_slo_s: float,
                   first_s: float | None = None) -> dict:
        """The summary with attainment against the serving workers' own SLO; with `first_s`,
        of the requests sent in the replay's first `first_s` seconds only."""
        records = self.records if first_s is None else \
            [r for r in self.records if r.send_at_s < first_s]
        return summarize(records, ttft_slo_s, tpot_slo_s)

    def play(self) -> "BackgroundReplay":
        """Replay the whole window now, in the foreground (a baseline with nothing else on)."""
        self._thread.start()
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"the serving replay failed: {self.error}") from self.error
        return self


_SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter: no lock or thread of the driver's


def _replay_in_own_process(plan: list[ReplayRequest], endpoints: list[str], model: dict, seed: int,
                           stop) -> list[RequestRecord]:
    """Run the replay in a child process until `stop` (a multiprocessing Event) is set and the
    requests in flight end; its records come back through a JSON file."""
    with tempfile.TemporaryDirectory(prefix="rose-users-") as tmp:
        out = Path(tmp) / "records.json"
        child = _SPAWN.Process(target=_users_process, name="rose-serving-users", daemon=True,
                               args=(plan, endpoints, model["id"], int(model["vocab_size"]), seed, stop, str(out)))
        child.start()
        child.join()
        if not out.exists():
            raise RuntimeError(f"the serving users' process exited with code {child.exitcode} "
                               "and no records")
        doc = json.loads(out.read_text())
    if doc.get("error"):
        raise RuntimeError(doc["error"])
    return [RequestRecord(**r) for r in doc["records"]]


def _users_process(plan, endpoints, model_id, vocab_size, seed, stop, out: str) -> None:
    try:
        records = replay_over_http(plan, endpoints, model_id, vocab_size, seed, stop=stop.is_set)
        doc = {"records": [asdict(r) for r in records]}
    except BaseException as e:  # noqa: BLE001 - the parent raises it, named
        doc = {"records": [], "error": f"{type(e).__name__}: {e}"}
    write_atomic(Path(out), json.dumps(doc))
