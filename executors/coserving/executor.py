"""SLO-safe co-serving executor: a serving model and a rollout model on one device, serving first.

API:
    cfg = CoServingConfig(serving_model_dir, rollout_model_dir, mode="rose", slo=None,
                          reserve_fraction=0.2, chunk_tokens=512, stall_timeout_s=2.0,
                          lease_s=10.0, kv_blocks=None, ...)   # executors/coserving/config.py
    ex = CoServingExecutor(cfg, worker="serving-0")  # builds both engines, profiles (cached)
    ex.submit_serving(prompt_ids, max_tokens, ignore_eos=False, temperature=0.0,
                      on_token=None, request_id=None) -> Future[ServingResult]  # ValueError if bad
    ex.abort_serving(request_id)             # e.g. the client went away
    ex.submit_rollout(TurnRequest) -> Future[TurnResult]  # "abort" = cut/stalled/evicted: reroute
    ex.abort_rollout(request_ids)            # the scheduler gave up on these turns
    ex.start_step()    # new RL step: rollout KV budget from recent serving peak; unfreeze
    ex.admitting() -> bool                   # would a rollout turn be admitted now
    ex.yield_to_user(prompt_len)             # a user the endpoint would refuse: rollout steps
                                             # stop for the TTFT SLO, KV cut if serving lacks it
    ex.metrics(fresh=False) -> dict          # counters, policy, SLO used, profiles (/metrics)
    ex.kv_timeline() -> dict   # KV blocks and memory events since start_step (kv_timeline.py)
    ex.load_rollout_weights(version, tensors); ex.rollout_weight_matches(tensors) -> bool | None
    ex.reset_rollout_prefix_cache() -> bool  # leases dropped too (benches: cold cache per case)
    ex.park() -> dict; ex.park_state() -> dict  # idle worker: rollout engine gone (parking.py)
    ex.close()
The Dask side (CoServingPlugin, generate_turns_coserving, coserving_state) is in
executors/coserving/plugin.py.
One thread owns both engines (vLLM engines are not thread-safe) and runs the control loop:
every iteration a serving step when serving has work, then at most one rollout step, which in
"rose" mode runs only if admitted (executors/coserving/step_gate.py); KV usage over time and
the evict/reload baseline are in executors/coserving/memory.py, the rollout engine's weights
(reload between turns, read back) in executors/coserving/rollout_weights.py.
"""
from __future__ import annotations

import itertools
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

from executors.coserving.config import CoServingConfig
from executors.coserving.engines import open_engine, shutdown_rollout
from executors.coserving.kv_timeline import KVTimeline
from executors.coserving.memory import MemoryWatch
from executors.coserving.metrics import snapshot
from executors.coserving.parking import Parking, new_park_state
from executors.coserving.rollout_side import RolloutSide
from executors.coserving.rollout_turn import empty_result, new_counters
from executors.coserving.rollout_weights import RolloutWeights
from executors.coserving.serving_side import ServingSide, ServingSubmission
from executors.coserving.step_gate import StepGate
from executors.engine.budgeted_scheduler import release_engine
from executors.engine.owner import EngineOwner
from executors.policies.autoscale import EvictReload
from executors.policies.kv_memory import KVMemoryPolicy
from executors.policies.prediction_margin import PredictionMargin
from executors.policies.slo_admission import SLOConfig
from executors.policies.stall import StallDetector
from executors.policies.turn_start import TurnStartGate
from executors.turns import TurnRequest


class CoServingExecutor(StepGate, MemoryWatch, RolloutWeights, Parking, EngineOwner):
    def __init__(self, cfg: CoServingConfig, worker: str = "serving-0") -> None:
        self.cfg, self.worker, self.wiring = cfg, worker, cfg.wiring
        self.version, self._weights = 0, None
        self.parking = new_park_state()  # parked while no run holds the worker (parking.py)
        self.counters = {"serving_submitted": 0, "rollout_submitted": 0, "admitted": 0, "denied": {},
                  "decisions": 0, "iterations": 0, "loop_s": 0.0, "decide_s": 0.0, "start_steps": 0,
                  "step_sizes": {}, "yielded_to_users": 0}
        self.rollout_counters = new_counters()
        self.autoscale = EvictReload(cfg.evict_load_threshold, cfg.reload_after_s)
        self._usage: deque[tuple[float, int]] = deque()  # (time, serving blocks) samples
        self.timeline = KVTimeline()  # the step's KV samples and events, for its step report
        self.recent_prompts: deque[int] = deque(maxlen=64)  # serving prompt lengths (admission)
        self._admitting = False
        self.margin = PredictionMargin()  # rollout steps' P99 took/predicted
        self.serving_margin = PredictionMargin()  # ... serving steps': the noise both see
        self.turn_gate = TurnStartGate(cfg.stall_timeout_s)
        self._turn_work = 0.0  # the last turn's predicted work (s): the gate's typical turn
        self.serving_slowdown = 1.0  # serving steps' measured / profiled time (the endpoint's)
        self.rollout_slowdown = 1.0  # ... rollout steps' (their cost, held against the slack)
        self.yield_until = -1.0  # monotonic s: no rollout step before this (a user at the door)
        self._snap: dict = {}
        self._ids = itertools.count(1)
        self._start(f"coserving-{worker}")  # builds both engines on the loop thread

    def _open(self) -> None:
        from executors.coserving.profile import profile_summary

        cfg, t0 = self.cfg, time.perf_counter()
        s_engine, s_sched, self.serving_profile, s_src = open_engine(cfg, "serving")
        self.serving = ServingSide(s_engine, s_sched, _vocab(s_engine), cfg.max_model_len)
        self.total = s_sched.usable_blocks()  # the emulated device pool, in pages
        self.policy = (KVMemoryPolicy(self.total, cfg.reserve_fraction, cfg.high_watermark,
                                      cfg.cut_factor, cfg.lease_s) if self.wiring.memory_policy else None)
        self.rollout: RolloutSide | None = None
        self.rollout_profile, r_src, self.page_ratio = None, None, 1.0
        if self.wiring.rollout:
            try:
                r_engine, r_sched, self.rollout_profile, r_src = open_engine(cfg, "rollout")
            except BaseException:
                release_engine(s_engine)
                raise
            self.page_ratio = r_sched.block_bytes() / s_sched.block_bytes()
            self.rollout = self._rollout_side(r_engine, r_sched)
        self.slo, self.slo_source = cfg.slo, "configured"
        if self.slo is None:
            self.slo = SLOConfig.from_profile(self.serving_profile)
            self.slo_source = ("derived from the serving profile: ttft = max(50 ms, 4 x P(2048)), "
                               "tpot = max(20 ms, 5 x D(16))")
        self.admission = self.new_admission()
        self.profiles = {"source": {"serving": s_src, "rollout": r_src},
                         "serving": profile_summary(self.serving_profile),
                         "rollout": profile_summary(self.rollout_profile) if self.rollout_profile else None}
        self.startup_s = time.perf_counter() - t0
        self._do_start_step()
        self._admitting = self._would_admit(time.monotonic())
        self._snap = snapshot(self)

    def _rollout_side(self, engine, scheduler) -> RolloutSide:
        return RolloutSide(engine, scheduler, self.rollout_profile, worker=self.worker,
                           policy=self.policy, stall=StallDetector(self.cfg.stall_timeout_s),
                           leases=self.wiring.leases, page_ratio=self.page_ratio, counters=self.rollout_counters)

    # ---- public API (any thread) ----
    def submit_serving(self, prompt_ids: list[int], max_tokens: int, *, ignore_eos: bool = False,
                       temperature: float = 0.0, on_token: Callable[[int, float], None] | None = None,
                       request_id: str | None = None) -> Future:
        self.serving.validate(prompt_ids, max_tokens, temperature)
        fut: Future = Future()
        request_id = request_id or f"serve-{next(self._ids)}"
        self._post(("serve", ServingSubmission(request_id, list(prompt_ids), max_tokens,
                                               ignore_eos, float(temperature), on_token, fut,
                                               time.monotonic())))
        return fut

    def abort_serving(self, request_id: str) -> None:
        self._post(("abort_serving", request_id))

    def submit_rollout(self, request: TurnRequest) -> Future:
        fut: Future = Future()
        self._post(("rollout", request, fut))
        return fut

    def abort_rollout(self, request_ids: list[str]) -> None:
        """Abort rollout turns now (the scheduler gave up on them); answered "abort"."""
        self._post(("abort_rollout", list(request_ids)))

    def start_step(self) -> None:
        self._call(lambda: self._do_start_step())

    def rollout_in_flight(self) -> list[str]:
        """Request ids of the rollout turns the executor holds now."""
        return self._call(lambda: list(self.rollout.live) if self.rollout is not None else [])

    def served_since(self, t: float) -> list:
        """Serving requests finished since monotonic time t (ServedRequest records)."""
        return self._call(lambda: self.serving.log.since(t))

    def admitting(self) -> bool:
        return self._admitting

    def set_slo(self, slo: SLOConfig, source: str) -> None:
        """A new SLO (e.g. derived from a serving-alone measurement): admission and the endpoint
        hold to it from the next decision on; `source` says how it was derived (/metrics)."""
        if not isinstance(slo, SLOConfig):
            raise TypeError(f"slo must be an SLOConfig, got {type(slo).__name__}")

        def swap():
            self.slo, self.slo_source = slo, source
            self.admission = self.new_admission()
        self._call(swap)

    def rollout_busy(self) -> bool:
        """Rollout turns hold the device now (read without the loop: a dict's length)."""
        return self.rollout is not None and bool(self.rollout.live)

    def yield_to_user(self, prompt_len: int) -> None:
        """A user the endpoint would refuse while rollout holds the device: serving first."""
        self._post(("yield", int(prompt_len)))

    def metrics(self, fresh: bool = False) -> dict:
        """Counters, policy snapshot, SLO, profiles. The loop refreshes it every 50 ms while
        busy and whenever it goes idle; fresh=True waits for the loop to build one now."""
        if fresh:
            return self._call(lambda: snapshot(self))
        return dict(self._snap)

    def _take(self, inbox: list[tuple]) -> None:
        now = time.monotonic()
        for item in inbox:
            kind = item[0]
            if kind == "serve":
                self.counters["serving_submitted"] += 1
                self.note_serving_prompt(len(item[1].prompt_ids))
                self.serving.add(item[1])
            elif kind == "abort_serving":
                self.serving.abort([item[1]])
            elif kind == "yield":
                self._yield(item[1], now)
            elif kind == "abort_rollout" and self.rollout is not None:
                self.rollout.abort(item[1], "other")
            elif kind == "rollout":
                self.counters["rollout_submitted"] += 1
                request, fut = item[1], item[2]
                if self.parking["parked"]:  # nothing ran: the scheduler places it elsewhere
                    self.rollout_counters["returned_unstarted"] += 1
                    fut.set_result(empty_result(request, self.worker, self.version, "returned"))
                elif self.rollout is None:  # serving_only, or evicted for a burst
                    self.rollout_counters["aborted_evict" if self.wiring.rollout else "aborted_other"] += 1
                    fut.set_result(empty_result(request, self.worker, self.version, "abort"))
                elif request.request_id not in self.rollout.live and not self.should_start(request, now):
                    self.rollout_counters["returned_unstarted"] += 1  # nothing ran: placed elsewhere
                    self.rollout_counters["start_declined"] += 1
                    fut.set_result(empty_result(request, self.worker, self.version, "returned"))
                else:
                    self.rollout.add(request, fut, now)
            elif kind == "call":
                self._run_call(item)

    def _yield(self, prompt_len: int, now: float) -> None:
        """No rollout step for the TTFT SLO (the user's first token is due within it); where
        serving's free KV cannot take the prompt, the memory policy cuts (turns rerouted)."""
        self.counters["yielded_to_users"] += 1
        self.yield_until = max(self.yield_until, now + self.slo.ttft_s)
        if self.policy is not None and self.rollout is not None:
            need = -(-(prompt_len + 1) // self.serving.scheduler.block_size)
            actions = self.policy.yield_to_serving(need, now)
            if actions:
                self.rollout.apply(actions)

    # ---- the control loop (one thread owns both engines) ----
    def _idle_wait(self) -> float:
        live = self.rollout is not None and self.rollout.has_work()
        return 0.005 if live else 0.25  # rollout waiting on KV room: poll; else timers only

    def _on_failure(self, exc: Exception) -> None:
        for live in self.serving.live.values():
            if not live.fut.done():
                live.fut.set_exception(RuntimeError(f"serving engine failed: {exc}"))
        self.serving.live.clear()
        if self.rollout is not None:
            for rid in list(self.rollout.live):
                t = self.rollout.live.pop(rid)
                self.rollout.stall.on_finish(rid)
                if self.policy is not None:
                    self.policy.on_rollout_free(rid)
                t.fut.set_result(empty_result(t.request, self.worker, self.version, "abort"))

    def _iterate(self, inbox: list[tuple]) -> None:
        t_iter = time.perf_counter()
        self._take(inbox)
        engine_s = 0.0
        if self.serving.has_work():
            self.serving.scheduler.block_cap = self._serving_cap()
            predicted = self.serving_step_cost()
            s0 = time.perf_counter()
            self.serving.step()
            took = time.perf_counter() - s0
            engine_s += took
            self.observe_serving_step(predicted, took)
        self._take(self._drain())  # serving arrivals during that step count as queued prefills
        now = time.monotonic()
        self._watch_memory(now)
        ran = False
        if self.rollout is not None:
            self.rollout.check_stalls(now)
            if self.rollout.has_work():
                d0 = time.perf_counter()
                go = self._decide(now)
                self.counters["decide_s"] += time.perf_counter() - d0
                self.counters["decisions"] += 1
                if go is not None:
                    took = self.rollout.step(*go)
                    self.observe_step(go[0], took)
                    engine_s += took
                    ran = True
        self._busy = self.serving.has_work() or ran
        now = time.monotonic()
        slack = self._slack_now(now) if self.rollout is not None and self.wiring.admission else None
        self._observe_turn_gate(now, slack, ran)
        self._admitting = self._would_admit(now, slack)
        self.counters["iterations"] += 1
        self.counters["loop_s"] += time.perf_counter() - t_iter - engine_s
        if not self._busy or not self._snap or now - self._snap["at"] >= 0.05:
            self._snap = snapshot(self)

    # ---- shutdown ----
    def _shutdown(self) -> None:
        self.serving.abort(list(self.serving.live))
        if self.rollout is not None:
            self.rollout.abort(list(self.rollout.live), "other")
            shutdown_rollout(self.rollout)
            self.rollout = None
        release_engine(self.serving.engine)


def _vocab(engine) -> int:
    return engine.model_config.get_vocab_size()

