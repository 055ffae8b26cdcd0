"""One simulated accelerator: a rollout engine, optionally behind a serving engine (co-serving).

One timeline per device (temporal sharing, paper 4.1): each iteration runs a serving step when
serving has work, then a rollout step if the real policies allow it: `plan_steps` prices it
from the rollout profile, `DualSLOAdmission.admit` holds it against both SLO slacks, and
`KVMemoryPolicy` grants its KV blocks (budget per RL step, burst cut, leases on prefix caches).
A started turn that admission keeps idle is reported by `StallDetector` and kept or aborted by
`keep_stalled`. Serving steps are sim/serving.py's engine.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from executors.policies.kv_memory import KVMemoryPolicy, MemoryState
from executors.policies.latency_profile import LatencyProfile
from executors.policies.slo_admission import DualSLOAdmission
from executors.policies.stall import StallDetector, keep_stalled
from executors.policies.step_plan import plan_steps
from sim.decode_jump import DecodeJump
from sim.engine_cost import ContextCost
from sim.events import EventLoop
from sim.kv_pool import KVPool
from sim.serving import BLOCK, ServingEngine, ServingStats
from sim.workload import ServingRequest

CHUNK = 512
POLL_S = 0.01  # how often an idle device with denied rollout work looks again
MAX_RUNNING = 64  # requests a rollout engine runs at once (vLLM's max_num_seqs)


@dataclass(slots=True)
class Turn:
    tid: str
    context: int  # tokens before this turn's response (the whole prompt)
    response: int
    prefill_left: int = 0
    out_left: int = 0
    rid: int = 0
    started: bool = False  # the engine computed some of it (aborting it loses work)
    cached: int = 0  # prompt tokens served from the prefix cache
    blocks: int = 0  # KV blocks it holds in a dedicated GPU's pool
    placed_at: float = 0.0  # when the router placed it (its pace counts queueing on the device)

    @property
    def kv_tokens(self) -> int:
        """Tokens in its KV cache now: the prompt prefilled (or cached) so far and its output."""
        return self.context - self.prefill_left + self.response - self.out_left


class Device(DecodeJump, KVPool):
    def __init__(self, loop: EventLoop, name: str, kind: str, rollout: LatencyProfile | None,
                 on_done: Callable[["Device", Turn], None], on_abort: Callable[["Device", Turn], None],
                 serving: LatencyProfile | None = None, admission: DualSLOAdmission | None = None,
                 memory: KVMemoryPolicy | None = None, stall: StallDetector | None = None,
                 arrivals: Iterator[ServingRequest] | None = None, slo_aware: bool = True,
                 on_iter: Callable[["Device"], None] | None = None, context: ContextCost | None = None,
                 kv_pool: int | None = None, jump: bool = False) -> None:
        self.loop, self.name, self.kind = loop, name, kind
        self.rollout, self.serving, self.admission = rollout, serving, admission
        self.memory, self.stall, self.slo_aware = memory, stall, slo_aware
        self.on_done, self.on_abort = on_done, on_abort
        self.waiting: list[Turn] = []
        self.running: list[Turn] = []
        self.max_running = MAX_RUNNING
        self.on_iter, self.borrowed = on_iter, kind == "serving"
        self.engine = ServingEngine(serving, arrivals) if serving is not None and arrivals is not None else None
        self.stats = self.engine.stats if self.engine is not None else ServingStats()
        self.busy = False
        self.eligible = rollout is not None  # staleness: holds a policy version the step may use
        self.rollout_tokens = 0
        self.aborted = self.stall_kept = self.preempted = 0
        self.context = context if context is not None and context.active else None
        self.kv_pool, self.kv_used = kv_pool, 0  # a dedicated GPU's own KV pool (vLLM's preemption)
        self._kept: dict[int, int] = {}
        self._denied_at = -math.inf
        self._rids = 0
        self._fresh = False  # a turn arrived during the current iteration
        self.jump, self._jump, self._gen = jump, None, 0  # sim/decode_jump.py
        if self.engine is not None and self.engine.next is not None:
            loop.at(self.engine.next.arrival, self._wake)

    # ---- inputs ---------------------------------------------------------------------------
    def submit(self, turn: Turn, prefix_hit: bool) -> None:
        """A turn routed here; a prefix hit prefills only the tokens after the cached prefix."""
        self._interrupt()
        if prefix_hit and self.memory is not None:
            prefix_hit = self.memory.drop_prefix(turn.tid) > 0  # the lease may have lapsed
        turn.cached = min(turn.context - 1, turn.cached) if prefix_hit else 0
        turn.prefill_left, turn.out_left = turn.context - turn.cached, turn.response
        self._rids += 1
        turn.rid, turn.started = self._rids, False
        self.waiting.append(turn)
        self._fresh = True
        if self.stall is not None:  # the executor watches a turn from acceptance, not first step
            self.stall.on_admit(turn.rid, self.loop.now, turn.tid)
        self._wake()

    def start_step(self, now: float) -> None:
        self._interrupt()
        if self.memory is not None:
            self.memory.start_step(min(self.memory.total_blocks, self._serving_blocks()), now)

    def admitting(self) -> bool:
        """Cheap flag for the router (the executor's `admitting()`): eligible and memory allows."""
        if not self.eligible:
            return False
        m = self.memory
        return m is None or (m.state is not MemoryState.PRESSURE and m.rollout_used < m.budget)

    def _serving_busy(self) -> bool:
        return self.engine is not None and self.engine.busy

    # ---- the iteration --------------------------------------------------------------------
    def _wake(self, _=None) -> None:
        if not self.busy:
            self.busy = True
            self.loop.at(self.loop.now, self._iterate, self._gen)

    def _iterate(self, gen: int) -> None:
        if gen != self._gen:  # a jump cut short by _interrupt: its end is not an iteration
            return
        self._land()
        now, engine, memory = self.loop.now, self.engine, self.memory
        self._fresh = False
        cost = 0.0
        if engine is not None:
            if engine.next is not None and engine.next.arrival <= now:
                engine.take_arrivals(now)
            if memory is not None:
                memory.expired_leases(now)  # lapsed prefix caches free their blocks
            if engine.queued or engine.running:  # a serving step; the memory policy sees its KV
                cost = engine.step(now)
                if memory is not None:
                    blocks = engine.blocks if engine.blocks < memory.total_blocks else memory.total_blocks
                    for act in memory.observe_serving(blocks, now + cost):
                        if act.kind == "abort":
                            self._abort(act.request_id)
                self.stats.busy_s += cost
        elif memory is not None:
            memory.expired_leases(now)
        serving_cost = cost
        if self.rollout is not None and (self.waiting or self.running):
            cost += self._rollout_step(now + cost)
        if self.on_iter is not None:
            self.on_iter(self)
        if self.jump and cost > 0 and self._jump is None and engine is not None:
            self._serving_jump_after(now, cost, cost == serving_cost)
        if cost > 0 or self._fresh:  # a turn routed here by on_iter starts now, not at the next arrival
            self.loop.at(now + cost if self._jump is None else self._jump_end(), self._iterate, self._gen)
            return
        self.busy = False
        if engine is not None and engine.next is not None:
            self.loop.at(engine.next.arrival, self._wake)

    def _serving_blocks(self) -> int:
        return self.engine.blocks if self.engine is not None else 0

    def _rollout_step(self, now: float) -> float:
        if self.rollout is None or not (self.waiting or self.running):
            return 0.0
        self._start_waiting(now)
        if not self.running:
            self._check_stalls(now)
            return 0.0 if self._serving_busy() else self._idle_poll()
        decodes = prefill = held = 0
        before = -1  # tokens cached before the first pending prefill's next chunk
        for t in self.running:
            if t.prefill_left == 0:
                decodes += 1
                held += t.context + t.response - t.out_left  # its kv_tokens, without the call
            else:
                prefill += t.prefill_left
                if before < 0:
                    before = t.context - t.prefill_left
        plans = plan_steps(decodes, prefill, 0, BLOCK, self.rollout, CHUNK)
        base = plans[0].cost_s if plans else 0.0
        plan = self._admit(self._candidates(plans, decodes, prefill, held, before), now)
        if plan is None:
            self._check_stalls(now)
            return 0.0 if self._serving_busy() else self._idle_poll()
        budget = plan.tokens - (decodes if plan.kind != "decode" else plan.tokens)
        stall, finished = self.stall, []
        for t in self.running:  # one pass: progress and finished turns
            t.started = True
            if t.prefill_left == 0:
                t.out_left -= 1
            elif budget > 0:
                take = min(budget, t.prefill_left)
                t.prefill_left -= take
                budget -= take
                if t.prefill_left == 0:
                    t.out_left -= 1  # the last prefill chunk samples the first token
            if stall is not None:
                stall.on_progress(t.rid, now)
            if t.out_left <= 0:
                finished.append(t)
        end = now + plan.cost_s
        if finished:
            self.running = [t for t in self.running if t.out_left > 0]
            for t in finished:
                self._finish(t, end)
        if self.kv_pool is not None:
            self._grow_kv()
        self._check_stalls(end)
        if self.jump and not finished:
            if plan.kind == "decode":
                self._jump_after(now, plan.cost_s, base, decodes, held)
            elif plan.kind == "prefill_chunk" and plan.tokens == plans[0].tokens:
                self._prefill_jump_after(now, plan.cost_s, base, decodes, held, before, plan.tokens - decodes)
        return plan.cost_s

    def _candidates(self, plans: list, decodes: int, prefill: int, held: int, before: int) -> Iterator:
        """The step's plans in the order admission tries them, each priced for its context (KV
        reads, attention to cached tokens) only when tried: most steps take the first."""
        ctx = self.context
        for i, plan in enumerate(plans):
            yield plan if ctx is None else ctx.priced(plan, decodes, held, before)
            if i == 0 and plan.kind == "prefill_chunk" and self.admission is not None and self.slo_aware:
                # as the executor's step gate: smaller chunks after the full one, before decodes only
                for c in (CHUNK // 2, CHUNK // 4, CHUNK // 8):
                    for p in plan_steps(decodes, prefill, 0, BLOCK, self.rollout, c):
                        if p.kind == "prefill_chunk" and p.tokens < plan.tokens:
                            yield p if ctx is None else ctx.priced(p, decodes, held, before)

    def _admit(self, plans: Iterator, now: float):
        if self.admission is None or not self.slo_aware:
            return next(plans, None)
        queued, active = self.engine.admission_view()
        kv_ok = self.memory is None or self.memory.state is not MemoryState.PRESSURE
        reason = "kv_headroom"
        for plan in plans:
            decision = self.admission.admit(plan.cost_s, queued, active, now, kv_ok)
            if decision.admitted:
                return plan
            reason = decision.reason
        if reason in ("ttft_slack", "tpot_slack"):  # serving's burst, not KV: a stall may wait
            self._denied_at = now
        return None

    def _idle_poll(self) -> float:
        """Rollout waits (admission's arrival-time TTFT guard, or KV) with serving idle: look
        again after a poll interval (the executor's loop does the same), or stop when nothing waits."""
        return POLL_S if (self.waiting or self.running) else 0.0

    def _start_waiting(self, now: float) -> None:
        while self.waiting and len(self.running) < self.max_running:
            t = self.waiting[0]
            blocks = math.ceil((t.context + t.response) / BLOCK)
            if self.memory is not None:
                if not self.memory.can_allocate(blocks):
                    return
                self.memory.on_rollout_alloc(t.rid, blocks, now, t.tid)
            if self.kv_pool is not None:  # vLLM admits a prompt whose whole KV fits the free pool
                prompt = math.ceil((t.context + 1) / BLOCK)
                if self.kv_used + prompt > self.kv_pool and self.running:
                    return
                t.blocks = prompt
                self.kv_used += prompt
            self.running.append(self.waiting.pop(0))

    def _finish(self, t: Turn, now: float) -> None:
        self.kv_used -= t.blocks
        t.blocks = 0
        self.rollout_tokens += t.context + t.response
        if self.memory is not None:
            self.memory.on_rollout_free(t.rid)
            self.memory.touch_prefix(t.tid, math.ceil((t.context + t.response) / BLOCK), now)
        if self.stall is not None:
            self.stall.on_finish(t.rid)
        self.on_done(self, t)

    def _check_stalls(self, now: float) -> None:
        if self.stall is None:
            return
        for rep in self.stall.check(now):
            t = next((x for x in self.running + self.waiting if x.rid == rep.request_id), None)
            if t is None:
                continue
            kept = self._kept.get(t.rid, 0)
            if keep_stalled(t.started, kept, now - self._denied_at, self.stall.timeout_s):
                self._kept[t.rid] = kept + 1
                self.stall_kept += 1
                self.stall.on_admit(t.rid, now, t.tid)
            else:
                self._abort(t.rid)

    def take_back(self, tid: str) -> None:
        """The scheduler takes a turn back (tail hand-back): aborted here, rerouted by on_abort."""
        self._interrupt()
        t = next((x for x in self.running + self.waiting if x.tid == tid), None)
        if t is not None:
            self._abort(t.rid)

    def _abort(self, rid: int) -> None:
        t = next((x for x in self.running + self.waiting if x.rid == rid), None)
        if t is None:
            return
        self.running = [x for x in self.running if x.rid != rid]
        self.waiting = [x for x in self.waiting if x.rid != rid]
        self.kv_used -= t.blocks
        t.blocks = 0
        if self.memory is not None:
            self.memory.on_rollout_free(rid)
        if self.stall is not None:
            self.stall.on_finish(rid)
        self.aborted += 1
        self.on_abort(self, t)
