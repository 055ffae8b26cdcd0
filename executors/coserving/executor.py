"""SLO-safe co-serving executor: a serving model and a rollout model on one device, serving first.

API (rose.md component 1; issue 4):
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
    ex.metrics(fresh=False) -> dict          # counters, policy, SLO used, profiles (/metrics)
    ex.load_rollout_weights(version, tensors); ex.rollout_weight_matches(tensors) -> bool | None
    ex.reset_rollout_prefix_cache() -> bool  # leases dropped too (benches: cold cache per case)
    ex.close()
    Dask side (executors/coserving/plugin.py, re-exported here): CoServingPlugin ("rose-coserving"),
    generate_turns_coserving(requests), coserving_state(), sync_weights_coserving(...).
One thread owns both engines (vLLM engines are not thread-safe) and runs the control loop:
every iteration a serving step when serving has work, then at most one rollout step, which in
"rose" mode runs only if DualSLOAdmission admits its predicted cost (rollout profile: the
chunk it will schedule, else the decode step of its batch) and the KV policy grants its
blocks. KV is one emulated device pool of `total` pages (page = serving block): each engine's
BudgetedScheduler gets a block cap so serving + rollout never exceed it (CPU has no VMM).
"""
from __future__ import annotations

import itertools
import math
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable

import torch

from executors.coserving.config import MODES, WIRING, CoServingConfig, Wiring  # noqa: F401
from executors.coserving.engines import EvictReload, open_engine, shutdown_rollout
from executors.coserving.metrics import snapshot
from executors.coserving.rollout_side import RolloutSide, empty_result, new_counters
from executors.coserving.serving_side import ServingResult, ServingSide  # noqa: F401
from executors.engine.owner import EngineOwner
from executors.policies.step_plan import StepPlan
from executors.engine.budgeted_scheduler import release_engine
from executors.policies.kv_memory import KVMemoryPolicy, MemoryState
from executors.policies.slo_admission import DualSLOAdmission, SLOConfig
from executors.policies.stall import StallDetector
from executors.turns import TurnRequest, TurnResult  # noqa: F401  (re-exported)


class CoServingExecutor(EngineOwner):
    def __init__(self, cfg: CoServingConfig, worker: str = "serving-0") -> None:
        self.cfg, self.worker, self.w = cfg, worker, cfg.wiring
        self.version, self._weights = 0, None
        self.c = {"serving_submitted": 0, "rollout_submitted": 0, "admitted": 0, "denied": {},
                  "decisions": 0, "iterations": 0, "loop_s": 0.0, "decide_s": 0.0, "start_steps": 0}
        self._rc = new_counters()
        self.autoscale = EvictReload(cfg.evict_load_threshold, cfg.reload_after_s)
        self._usage: deque[tuple[float, int]] = deque()  # (time, serving blocks) samples
        self._admitting = False
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
                                      cfg.cut_factor, cfg.lease_s) if self.w.memory_policy else None)
        self.rollout: RolloutSide | None = None
        self.rollout_profile, r_src, self.page_ratio = None, None, 1.0
        if self.w.rollout:
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
        self.admission = DualSLOAdmission(self.serving_profile, self.slo, "mixed", "monolithic")
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
                           leases=self.w.leases, page_ratio=self.page_ratio, counters=self._rc)

    # ---- public API (any thread) ----
    def submit_serving(self, prompt_ids: list[int], max_tokens: int, *, ignore_eos: bool = False,
                       temperature: float = 0.0, on_token: Callable[[int, float], None] | None = None,
                       request_id: str | None = None) -> Future:
        self.serving.validate(prompt_ids, max_tokens, temperature)
        fut: Future = Future()
        request_id = request_id or f"serve-{next(self._ids)}"
        self._post(("serve", request_id, list(prompt_ids), max_tokens, ignore_eos,
                    float(temperature), on_token, fut, time.monotonic()))
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

    def admitting(self) -> bool:
        return self._admitting

    def load_rollout_weights(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        self._call(lambda: self._load_weights(version, tensors))

    def reset_rollout_prefix_cache(self) -> bool:
        """Drop every leased rollout prefix and vLLM's rollout prefix cache (benches: a cold
        start per case). False when turns still hold blocks (vLLM then keeps its cache)."""
        def reset() -> bool:
            if self.rollout is None:
                return False
            self.rollout.drop_all_leases()
            return bool(self.rollout.engine.reset_prefix_cache())
        return self._call(reset)

    def rollout_weight_matches(self, tensors: dict[str, torch.Tensor]) -> bool | None:
        """Does the rollout engine hold these embeddings bit for bit (None: cannot tell)."""
        from executors.engine.vllm_engine import read_weight

        name = "model.embed_tokens.weight"
        if name not in tensors or self.rollout is None:
            return None

        def same() -> bool | None:
            if self.rollout is None:
                return None
            want = tensors[name]
            got = read_weight(self.rollout.engine, name)[: want.shape[0]]  # vLLM pads the vocab
            return bool(torch.equal(got.view(torch.int16), want.view(torch.int16)))
        return self._call(same)

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
                self.c["serving_submitted"] += 1
                self.serving.add(*item[1:])
            elif kind == "abort_serving":
                self.serving.abort([item[1]])
            elif kind == "abort_rollout" and self.rollout is not None:
                self.rollout.abort(item[1], "other")
            elif kind == "rollout":
                self.c["rollout_submitted"] += 1
                request, fut = item[1], item[2]
                if self.rollout is None:  # serving_only, or evicted for a burst
                    self._rc["aborted_evict" if self.w.rollout else "aborted_other"] += 1
                    fut.set_result(empty_result(request, self.worker, self.version, "abort"))
                else:
                    self.rollout.add(request, fut, now)
            elif kind == "call":
                self._run_call(item)

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
            s0 = time.perf_counter()
            self.serving.step()
            engine_s += time.perf_counter() - s0
        self._take(self._drain())  # serving arrivals during that step count as queued prefills
        now = time.monotonic()
        self._watch_memory(now)
        ran = False
        if self.rollout is not None:
            self.rollout.check_stalls(now)
            if self.rollout.has_work():
                d0 = time.perf_counter()
                go = self._decide(now)
                self.c["decide_s"] += time.perf_counter() - d0
                self.c["decisions"] += 1
                if go is not None:
                    engine_s += self.rollout.step(*go)
                    ran = True
        self._busy = self.serving.has_work() or ran
        self._admitting = self._would_admit(time.monotonic())
        self.c["iterations"] += 1
        self.c["loop_s"] += time.perf_counter() - t_iter - engine_s
        if not self._busy or not self._snap or now - self._snap["at"] >= 0.05:
            self._snap = snapshot(self)

    def _serving_cap(self) -> int | None:
        """Serving's share of the emulated device pool: what rollout does not hold."""
        if self.rollout is None:
            return None
        if self.w.static_share is not None:
            return self.total - math.floor(self.total * self.w.static_share)
        held = (self.policy.rollout_used if self.policy is not None
                else self.rollout.pages(self.rollout.used_blocks()))
        return max(0, self.total - held)

    def _rollout_cap(self) -> int:
        r = self.rollout
        if self.policy is not None:
            return r.used_blocks() + r.blocks_for(r.room_pages())
        share = 1.0 if self.w.static_share is None else self.w.static_share
        return r.blocks_for(math.floor(self.total * share))

    def _decide(self, now: float) -> tuple[StepPlan, int] | None:
        """(plan, block cap) of the rollout step to run now, or None (not admitted)."""
        r, chunk = self.rollout, self.cfg.chunk_tokens if self.w.chunked else None
        admit = r.scheduler.admission_blocks()
        if r.lease_blocks:  # live turns before idle prefixes (the admission need included)
            wanted = r.blocks_wanted(chunk, admit)
            if r.blocked_room is not None:  # the last step under this room scheduled nothing
                wanted = max(wanted, r.blocked_room + 1)
            if r.reclaim_leases(r.pages(wanted)):  # evicted prefixes may have been its hits
                admit = r.scheduler.admission_blocks()
        cap = self._rollout_cap()
        room = max(0, cap - r.used_blocks())
        plans = r.plans(chunk, room, admit)
        if r.blocked_room is not None and room <= r.blocked_room and now < r.blocked_until:
            plans = []  # the last step under this much room scheduled nothing
        if not plans:  # nothing fits the KV room (or nothing to schedule): wait
            self.c["denied"]["kv_headroom"] = self.c["denied"].get("kv_headroom", 0) + 1
            return None
        if not self.w.admission:
            return plans[0], cap
        reason = "kv_headroom"
        queued, active = self.serving.queued_prefills(), self.serving.active_decodes()
        for plan in plans:
            # plans fit the room the policy grants (budget and reserve kept; a "preempt" step
            # takes no more than that room): the cap holds every step to it
            kv_ok = self.policy.state is not MemoryState.PRESSURE and plan.blocks <= room
            d = self.admission.admit(plan.cost_s, queued, active, now, kv_ok)
            if d.admitted:
                self.c["admitted"] += 1
                return plan, cap
            reason = d.reason
        self.c["denied"][reason] = self.c["denied"].get(reason, 0) + 1
        return None

    def _would_admit(self, now: float) -> bool:
        r = self.rollout
        if r is None or len(r.live) >= self.cfg.max_num_seqs:
            return False
        if self.policy is not None and r.room_pages(with_leases=True) < r.pages(1):
            return False
        if not self.w.admission:
            return True
        slack = min(self.admission.ttft_slack(self.serving.queued_prefills(), now),
                    self.admission.tpot_slack(self.serving.active_decodes(), now))
        return self.rollout_profile.decode_step(len(r.live) + 1) <= slack

    # ---- memory ----
    def _watch_memory(self, now: float) -> None:
        used = self.serving.used_blocks()
        if not self._usage or used > self._usage[-1][1] or now - self._usage[-1][0] >= 0.1:
            self._usage.append((now, used))
            while self._usage and now - self._usage[0][0] > self.cfg.usage_window_s:
                self._usage.popleft()
        if self.policy is not None and self.rollout is not None:
            actions = self.policy.observe_serving(min(used, self.total), now)
            if actions:
                self.rollout.apply(actions)
            self.rollout.expire_leases(now)
        if self.w.evict_on_burst:
            self._autoscale(now)

    def _do_start_step(self) -> None:
        now = time.monotonic()
        peak = max([u for _, u in self._usage] + [self.serving.used_blocks()])
        if self.policy is not None:
            self.policy.start_step(min(peak, self.total), now)
        self.c["start_steps"] += 1

    def _autoscale(self, now: float) -> None:
        act = self.autoscale.tick(len(self.serving.live), self.rollout is not None, now)
        if act == "evict":
            self.rollout.abort(list(self.rollout.live), "evict")
            shutdown_rollout(self.rollout)
            self.rollout = None
        elif act == "reload":
            t0 = time.perf_counter()  # the real cost: engine build + warm-up + weights
            engine, sched, _, _ = open_engine(self.cfg, "rollout")
            self.rollout = self._rollout_side(engine, sched)
            if self._weights is not None:
                self._load_weights(*self._weights)
            self.rollout.version = self.version
            self.autoscale.reload_s.append(time.perf_counter() - t0)

    def _load_weights(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        from executors.engine.vllm_engine import reload_weights

        if self.rollout is not None:
            reload_weights(self.rollout.engine, tensors)
            self.rollout.drop_all_leases()
            self.rollout.version = version
        self.version = version
        if self.w.evict_on_burst:
            self._weights = (version, tensors)  # a rebuilt engine starts from the model dir

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


# The Dask side lives in executors/coserving/plugin.py; callers import it from here.
from executors.coserving.plugin import (CoServingPlugin, coserving_state,  # noqa: E402,F401
                                        generate_turns_coserving, sync_weights_coserving)
