"""The rollout half of a co-serving executor: turns on the rollout engine, under a KV policy.

Owns the rollout engine's live turns and keeps three plain-Python policies in step with the
engine's real state: KVMemoryPolicy (blocks per request, prefix leases), StallDetector
(progress = computed tokens grew; for a turn still queued, a productive step) and the step
plan admission judges (executors/policies/step_plan.py). KV is accounted in
pages: one page = one serving-engine block; a rollout block is `page_ratio` pages (the two
models' KV layouts differ, as on a GPU where both map one physical pool). Loop thread only.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import Future

from executors.coserving.rollout_turn import ABORTED, Turn, empty_result, new_counters, turn_result
from executors.engine.submit import add_tokens
from executors.policies.kv_memory import Action, KVMemoryPolicy, MemoryState
from executors.policies.latency_profile import LatencyProfile
from executors.policies.step_plan import StepPlan, blocks_wanted, plan_steps
from executors.policies.stall import StallDetector, keep_stalled
from executors.turns import TurnRequest


BLOCKED_RETRY_S = 0.25  # an empty step's room is retried after this even if it did not grow
STALL_KEEPS = 4  # a started turn idle only because serving had no slack is kept this many times


class RolloutSide:
    def __init__(self, engine, scheduler, profile: LatencyProfile, *, worker: str,
                 policy: KVMemoryPolicy | None, stall: StallDetector, leases: bool,
                 page_ratio: float, counters: dict | None = None) -> None:
        self.engine, self.scheduler, self.profile = engine, scheduler, profile
        self.worker, self.policy, self.stall = worker, policy, stall
        self.leases, self.page_ratio = leases, page_ratio
        scheduler.capture_released = leases
        self.version = 0
        self.live: dict[str, Turn] = {}
        self.blocked_room: int | None = None  # KV room when a step scheduled nothing
        self.blocked_until = 0.0  # ... retried anyway after this (monotonic s): a safety net
        self.lease_blocks: dict[str, list[int]] = {}  # trajectory -> cached block ids
        self.slack_denied_at = -math.inf  # last step admission denied for serving slack
        self.stall_keeps: dict[str, int] = {}  # started turns kept past a stall, times kept
        self.counters = counters if counters is not None else new_counters()

    def pages(self, blocks: int) -> int:
        return math.ceil(blocks * self.page_ratio - 1e-9)

    def blocks_for(self, pages: int) -> int:
        return max(0, math.floor(pages / self.page_ratio + 1e-9))

    def used_blocks(self) -> int:
        return self.scheduler.used_blocks()

    def has_work(self) -> bool:
        return bool(self.live)

    # ---- turns in ----
    def add(self, request: TurnRequest, fut: Future, now: float) -> None:
        if request.min_policy_version > self.version:
            self.counters["stale"] += 1
            fut.set_result(empty_result(request, self.worker, self.version, "stale"))
            return
        if request.request_id in self.live:
            fut.set_exception(ValueError(f"turn {request.request_id} is already in flight"))
            return
        try:
            internal = add_tokens(self.engine, request.request_id, request.prompt_ids,
                                  max_tokens=request.max_tokens, temperature=request.temperature,
                                  top_p=request.top_p, seed=request.seed, logprobs=0,
                                  stop_token_ids=request.stop_token_ids)
        except Exception as exc:  # e.g. longer than max_model_len: this turn only
            fut.set_exception(ValueError(f"turn {request.request_id} rejected: {exc}"))
            return
        tid = request.trajectory_id
        if tid in self.lease_blocks:  # the new turn takes over its prefix (hits, then holds it)
            self.lease_blocks.pop(tid)
            if self.policy is not None:
                self.policy.drop_prefix(tid)
        self.live[request.request_id] = Turn(request, fut, internal, now)
        self.blocked_room = None  # new work: it may fit where the queued work did not
        self.stall.on_admit(request.request_id, now, tid)

    # ---- planning (what admission judges) ----
    def plans(self, chunk_tokens: int | None, room_blocks: int | None = None,
              admit_blocks: int | None = None) -> list[StepPlan]:
        """Plans for the next step from the engine's pending work (rollout_step_plan): vLLM's
        whole-sequence admission need counted, a "preempt" step when nothing fits the room
        but running turns hold blocks. admit_blocks: scheduler.admission_blocks(), if the
        caller already asked (it looks up prefix hits: once per decision is enough)."""
        if admit_blocks is None:
            admit_blocks = self.scheduler.admission_blocks()
        return plan_steps(*self.scheduler.pending_work(), self.scheduler.block_size,
                          self.profile, chunk_tokens, room_blocks, admit_blocks=admit_blocks,
                          held_blocks=self.used_blocks())

    def blocks_wanted(self, chunk_tokens: int | None, admit_blocks: int) -> int:
        return blocks_wanted(*self.scheduler.pending_work(), self.scheduler.block_size,
                             chunk_tokens, admit_blocks)

    def reclaim_leases(self, pages_wanted: int) -> int:
        """Live turns before idle prefixes: end the oldest leases until `pages_wanted` fit the
        budget (vLLM itself would evict those cached blocks to allocate). Returns leases ended."""
        ended = 0
        while self.lease_blocks and self.room_pages() < pages_wanted:
            tid = next(iter(self.lease_blocks))  # insertion order = soonest to expire
            ids = self.lease_blocks.pop(tid)
            self.policy.drop_prefix(tid)
            self.counters["lease_blocks_evicted"] += self.scheduler.evict_cached(ids)
            self.counters["leases_reclaimed"] += 1
            ended += 1
        return ended

    def room_pages(self, with_leases: bool = False) -> int:
        """Pages rollout may still take under the memory policy (with_leases: counting the
        leased prefixes reclaim_leases would end)."""
        p = self.policy
        if p is None or p.state is MemoryState.PRESSURE:
            return 0
        used = p.request_blocks if with_leases else p.rollout_used
        return max(0, min(p.budget - used, p.total_blocks - p.serving_used - used - p.reserve_blocks))

    # ---- one engine step ----
    def step(self, plan: StepPlan | None, block_cap: int | None, now_fn=time.monotonic) -> float:
        self.scheduler.token_budget = plan.tokens if plan is not None else None
        self.scheduler.block_cap = block_cap
        t0 = time.perf_counter()
        outputs = self.engine.step()
        took = time.perf_counter() - t0
        now = now_fn()
        self.counters["steps"] += 1
        self.counters["step_s"] += took
        self.counters["scheduled_tokens"] += self.scheduler.last_scheduled_tokens
        if self.scheduler.last_scheduled_tokens == 0:
            # vLLM refused everything under the cap (prefix hits and its watermark take blocks
            # the plan did not count): do not retry until the KV room grows
            self.counters["empty_steps"] += 1
            self.blocked_room = max(0, (block_cap or 0) - self.used_blocks())
            self.blocked_until = now + BLOCKED_RETRY_S
        else:
            self.blocked_room = None
        released = self.scheduler.take_released() if self.leases else {}
        if plan is not None:
            self.counters["planned_steps"] += 1
            self.counters["planned_step_s"] += took
            self.counters["predicted_s"] += plan.cost_s
            self.counters["abs_error_s"] += abs(took - plan.cost_s)
        for out in outputs:
            t = self.live.get(out.request_id)
            if t is None:
                continue
            completion = out.outputs[0]
            new = [int(x) for x in completion.token_ids]
            t.ids += new
            t.logprobs += [float(lp[tok].logprob) for lp, tok in zip(completion.logprobs or [], new)]
            if new:
                t.first_token_at = t.first_token_at or now
                t.last_token_at = now
                self.counters["tokens"] += len(new)
            t.cached = int(out.num_cached_tokens or t.cached)
            if out.finished:
                reason = completion.finish_reason
                reason = reason if reason in ("stop", "length") else "abort"
                self._finish(out.request_id, reason, now, released)
        self.sync(now, queue_moved=self.scheduler.last_scheduled_tokens > 0)
        return took

    def sync(self, now: float, queue_moved: bool = False) -> None:
        """Progress for the stall detector; blocks held, in pages, for the memory policy.

        A turn that has not started yet counts a productive rollout step (queue_moved) as
        progress: waiting FCFS behind other turns on a working rollout engine is not a stall;
        an engine starved by serving (no admitted step) or by KV (nothing schedulable) is.
        """
        for rid, t in self.live.items():
            req = self.scheduler.requests.get(t.internal)
            if req is None:
                continue
            if req.num_computed_tokens > t.computed:
                t.computed = req.num_computed_tokens
                t.first_progress = t.first_progress or now
                self.stall.on_progress(rid, now)
            elif queue_moved and t.first_progress is None:
                self.stall.on_progress(rid, now)
            if self.policy is not None:
                pages = self.pages(self.scheduler.request_blocks(t.internal))
                if pages < t.pages:  # vLLM preempted it (recompute): its blocks went back
                    self.policy.on_rollout_free(rid)
                    t.pages = 0
                if pages > t.pages:
                    self.policy.on_rollout_alloc(rid, pages - t.pages, now, t.request.trajectory_id)
                    t.pages = pages

    # ---- turns out ----
    def _finish(self, rid: str, reason: str, now: float, released: dict[str, list[int]]) -> None:
        t = self.live.pop(rid)
        self.stall.on_finish(rid)
        self.stall_keeps.pop(rid, None)
        if self.policy is not None:
            self.policy.on_rollout_free(rid)
        if reason == "abort":
            self.counters[ABORTED["other"]] += 1
            self.counters["aborted_started" if t.started else "returned_unstarted"] += 1
        else:
            self.counters["finished"] += 1
            self.counters["cached_tokens"] += t.cached
            if t.internal in released:
                self._lease(t.request.trajectory_id, released[t.internal], now)
        t.fut.set_result(turn_result(t, self.worker, self.version, reason))

    def _lease(self, tid: str, block_ids: list[int], now: float) -> None:
        cached = self.scheduler.cached_blocks(block_ids)
        if not cached or self.policy is None:
            return
        if self.policy.touch_prefix(tid, self.pages(len(cached)), now):
            self.lease_blocks.pop(tid, None)  # re-insert: the dict's order is expiry order
            self.lease_blocks[tid] = cached
        else:  # no room under the budget: reclaim at once
            self.counters["lease_blocks_evicted"] += self.scheduler.evict_cached(cached)

    def abort(self, rids: list[str], why: str) -> int:
        """Abort live turns (engine abort frees their KV); each future gets finished_reason
        "abort", which the scheduler reroutes. why: a key of ABORTED ("cut", "stall", "evict",
        "other")."""
        counter = ABORTED[why]
        rids = [rid for rid in rids if rid in self.live]
        if not rids:
            return 0
        self.engine.abort_request(rids)
        self.scheduler.take_released()  # aborted KV is not worth a lease
        for rid in rids:
            t = self.live.pop(rid)
            self.stall.on_finish(rid)
            self.stall_keeps.pop(rid, None)
            if self.policy is not None:
                self.policy.on_rollout_free(rid)
            self.counters[counter] += 1
            self.counters["aborted_started" if t.started else "returned_unstarted"] += 1
            t.fut.set_result(turn_result(t, self.worker, self.version, "abort"))
        return len(rids)

    def apply(self, actions: list[Action]) -> None:
        """Carry out an emergency cut: drop leased prefixes, abort the chosen turns."""
        for a in actions:
            if a.kind == "drop_prefix":
                ids = self.lease_blocks.pop(a.trajectory_id, [])
                self.counters["prefixes_dropped"] += 1
                self.counters["lease_blocks_evicted"] += self.scheduler.evict_cached(ids)
        self.abort([a.request_id for a in actions if a.kind == "abort"], "cut")

    def expire_leases(self, now: float) -> None:
        if self.policy is None:
            return
        for lease in self.policy.expired_leases(now):
            ids = self.lease_blocks.pop(lease.trajectory_id, [])
            self.counters["leases_expired"] += 1
            self.counters["lease_blocks_evicted"] += self.scheduler.evict_cached(ids)

    def check_stalls(self, now: float) -> list:
        """Abort stalled turns, except a started turn idle only because serving had no slack
        (admission denied it within the stall window): its KV is kept and it resumes when the
        burst passes (preempted in place, not thrown away), up to STALL_KEEPS times. A turn
        not started yet, or stuck on KV, is aborted (rerouted from its prompt)."""
        reports, aborted = self.stall.check(now), []
        for r in reports:
            t = self.live.get(r.request_id)
            kept = self.stall_keeps.get(r.request_id, 0)
            if t is not None and keep_stalled(t.first_progress is not None, kept, now - self.slack_denied_at,
                                              self.stall.timeout_s, STALL_KEEPS):
                self.stall_keeps[r.request_id] = kept + 1
                self.stall.on_admit(r.request_id, now, r.trajectory_id)
                self.counters["stall_kept"] += 1
            else:
                aborted.append(r.request_id)
        self.abort(aborted, "stall")
        return [r for r in reports if r.request_id in aborted]

    def drop_all_leases(self) -> None:
        """Weights changed: cached KV came from the old policy."""
        for tid, ids in list(self.lease_blocks.items()):
            if self.policy is not None:
                self.policy.drop_prefix(tid)
            self.scheduler.evict_cached(ids)
        self.lease_blocks.clear()
