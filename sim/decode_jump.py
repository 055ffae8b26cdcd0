"""Event jumping: a run of decode steps in which nothing but the clock and the tokens moves,
taken as one event instead of one per step. A mixin of Device (sim/device.py).

At thousands of tokens a turn, one event per decode iteration is most of a paper-scale run
(1,024 GPUs). Between two things that change what a device does (a turn finishing, a waiting
turn starting, a serving arrival or retirement, admission changing its answer, the KV pool
preempting, a lease ending, a stall falling due), every step is a decode of the same batch
whose cost the engine model gives in closed form: the profile's D(B) plus the KV reads of a
context that grows by B tokens a step (sim/engine_cost.py), so step i ends at an arithmetic
series' sum (SilentRun). The device takes the run as one event and lands its effects (tokens
out, KV blocks, serving steps, stall progress) at its end, or, when something from outside
(a turn routed here, one taken back, a new RL step) touches the device mid-run, for the steps
begun by then, and looks again at the end of the step in progress, as the per-iteration engine
would. The per-iteration engine is kept (SimConfig.event_jump=False); tests/test_sim_jump.py
runs both and compares: a sum in closed form differs from the step-by-step one in the last bits.

Three runs jump: rollout decodes with serving idle (admission's slack then reads no clock);
serving decodes with no rollout work; serving decodes while admission refuses the waiting
rollout step (it is asked against the same view each step: no queued prefill, the decodes'
tokens just out, the same batches) until a stall would fall due.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from executors.policies.kv_memory import MemoryState


@dataclass(slots=True)
class SilentRun:
    """`n` silent steps after the regular one that ends at `b0`; step i (1..n) costs
    base + kv x max(0, over + i x batch) seconds (kv = 0: base alone)."""

    kind: str  # "rollout" or "serving"
    b0: float
    base: float
    kv: float = 0.0
    over: int = 0  # cached tokens beyond the profile's reference context, at the regular step
    batch: int = 1
    n: int = 0
    landed: int = 0
    denials: bool = False  # serving run: each step's rollout check was refused for slack

    def end(self, j: int) -> float:
        """When silent step j ends (j = 0: the regular step before them)."""
        if not self.kv:
            return self.b0 + j * self.base
        o, b = self.over, self.batch
        i0 = 1 if o >= 0 else -o // b + 1  # the first step whose context passes the reference
        m = j - i0 + 1
        tokens = m * o + b * (i0 + j) * m // 2 if m > 0 else 0
        return self.b0 + (j * self.base + self.kv * tokens)

    def cost(self, i: int) -> float:
        over = self.over + i * self.batch
        return self.base + (over if over > 0 else 0) * self.kv if self.kv else self.base


def last_true(pred, hi: int) -> int:
    """The largest i in 0..hi with pred(i), pred true at 0 and monotone (true, then false)."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class DecodeJump:
    def _jump_after(self, start: float, first_cost: float, base_cost: float, decodes: int, held: int) -> None:
        """After the rollout decode step that started at `start` (cost `first_cost`), the further
        steps that would change nothing else. `base_cost`: D(B) before context; `held`: the
        batch's cached tokens at that step."""
        running, engine = self.running, self.engine
        if self.waiting or self._fresh or len(running) != decodes or (engine is not None and engine.busy):
            return
        n = min(t.out_left for t in running) - 1  # the step that finishes a turn is a regular one
        if self.kv_pool is not None and n > 0:
            n = self._pool_room(n)
        if n <= 0:
            return
        ctx = self.context
        run = SilentRun("rollout", start + first_cost, base_cost, ctx.kv_s_per_token if ctx else 0.0,
                        held - decodes * ctx.reference_context if ctx else 0, decodes)
        if self.admission is not None and self.slo_aware:  # serving idle: its slack reads no clock
            slack = self.admission.admit(0.0, [], [], start, self.memory is None
                                         or self.memory.state is not MemoryState.PRESSURE).slack
            n = last_true(lambda i: i == 0 or run.cost(i) <= slack, n)
        self._start_run(run, n, self._quiet_until())

    def _serving_jump_after(self, start: float, first_cost: float, denied: bool) -> None:
        """After a serving step whose rollout side had nothing to run or was `denied`, the serving
        decode steps that retire nothing, take no arrival, keep the serving KV under the memory
        policy's watermark and end before the stall detector would report a waiting turn."""
        engine, memory = self.engine, self.memory
        rollout_work = bool(self.waiting or self.running)
        if (rollout_work and not denied) or self._fresh or engine.queued or not engine.running:
            return
        run = SilentRun("serving", start + first_cost, engine.decode_cost())
        n = engine.steps_to_retire()
        if memory is not None and n > 0:  # at the watermark a burst cut is due: a regular step
            top, cap = memory.total_blocks, memory.watermark_blocks
            if min(engine.blocks_bound(n), top) >= cap:  # the common case, well below it, skips this
                n = last_true(lambda i: i == 0 or min(engine.blocks_after(i), top) < cap, n)
        if rollout_work and self.stall is not None and n > 0:
            oldest, timeout = self.stall.oldest_progress(), self.stall.timeout_s
            n = last_true(lambda i: i == 0 or run.end(i) - oldest < timeout, n)
        run.denials = rollout_work and self._denied_at == run.b0
        self._start_run(run, n, self._quiet_until())

    def _quiet_until(self) -> float:
        """Until when nothing of the device's own changes by itself: the next serving arrival, the
        next lease end (a lapsed lease frees blocks, so admitting() may change)."""
        engine, memory = self.engine, self.memory
        stop_at = engine.next.arrival if engine is not None and engine.next is not None else math.inf
        return min(stop_at, memory.next_lease_end) if memory is not None else stop_at

    def _start_run(self, run: SilentRun, n: int, stop_at: float) -> None:
        if n > 0 and stop_at < math.inf:  # silent step i begins at end(i - 1): before stop_at
            n = last_true(lambda i: i == 0 or run.end(i - 1) < stop_at, n)
        if n > 0:
            run.n = n
            self._jump = run

    def _jump_end(self) -> float:
        return self._jump.end(self._jump.n)

    def _land(self, upto: int | None = None) -> None:
        """Apply the run's silent steps up to `upto` (all by default)."""
        run = self._jump
        if run is None:
            return
        upto = run.n if upto is None else upto
        k = upto - run.landed
        if k > 0:
            if run.kind == "rollout":
                self._land_rollout(k, run.end(upto - 1))
            else:
                self._land_serving(run, k, run.end(upto))
            run.landed = upto
        if upto == run.n:
            self._jump = None

    def _land_rollout(self, k: int, last_start: float) -> None:
        """k steps each took a token of every running turn; the last began at `last_start`."""
        for t in self.running:
            t.out_left -= k
            if self.stall is not None:
                self.stall.on_progress(t.rid, last_start)
        if self.kv_pool is not None:
            self._grow_kv()

    def _land_serving(self, run: SilentRun, k: int, last_end: float) -> None:
        """k serving decode steps ending at `last_end`; below the watermark the memory policy
        only records the usage."""
        self.engine.silent_decodes(k, last_end)
        self.stats.busy_s += k * run.base
        if self.memory is not None:
            self.memory.observe_serving(min(self.engine.blocks, self.memory.total_blocks), last_end)
        if run.denials:
            self._denied_at = last_end

    def _interrupt(self) -> None:
        """Something from outside touches the device mid-run: the steps begun by now happened;
        the device looks again at the end of the step in progress."""
        run = self._jump
        if run is None:
            return
        now = self.loop.now
        begun = last_true(lambda i: i == 0 or run.end(i - 1) <= now, run.n)
        self._land(begun)
        self._jump = None
        self._gen += 1
        self.loop.at(run.end(begun), self._iterate, self._gen)
