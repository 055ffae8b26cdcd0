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

Four runs jump: rollout decodes with serving idle (admission's slack then reads no clock);
on a dedicated rollout GPU, prefill chunks of one prompt beside the same decodes (the chunk's
attention to the prompt's cached part grows by a chunk a step: one more linear term); serving
decodes with no rollout work; serving decodes while admission refuses the waiting rollout step
(it is asked against the same view each step: no queued prefill, the decodes' tokens just out,
the same batches) until a stall would fall due. Turns waiting on a dedicated GPU whose batch or
KV pool is full stay waiting through a run: neither frees until a turn finishes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from executors.policies.kv_memory import MemoryState
from sim.serving import BLOCK


@dataclass(slots=True)
class SilentRun:
    """`n` silent steps after the regular one that ends at `b0`; step i (1..n) costs
    base + slope x i + kv x max(0, over + i x batch) seconds (kv = 0: no KV term)."""

    kind: str  # "rollout" or "serving"
    b0: float
    base: float
    kv: float = 0.0
    over: int = 0  # cached tokens beyond the profile's reference context, at the regular step
    batch: int = 1
    n: int = 0
    landed: int = 0
    denials: bool = False  # serving run: each step's rollout check was refused for slack
    slope: float = 0.0  # a prefill run: what each step's chunk adds, attending a chunk more
    prefill: object = None  # a prefill run: the Turn whose prompt takes each step's chunk
    take: int = 0  # ... and how many of its tokens a step takes

    def end(self, j: int) -> float:
        """When silent step j ends (j = 0: the regular step before them)."""
        grown = self.slope * (j * (j + 1) // 2) if self.slope else 0.0
        if not self.kv:
            return self.b0 + (j * self.base + grown)
        o, b = self.over, self.batch
        i0 = 1 if o >= 0 else -o // b + 1  # the first step whose context passes the reference
        m = j - i0 + 1
        tokens = m * o + b * (i0 + j) * m // 2 if m > 0 else 0
        return self.b0 + (j * self.base + self.kv * tokens + grown)

    def cost(self, i: int) -> float:
        over = self.over + i * self.batch
        return self.base + self.slope * i + (self.kv * over if self.kv and over > 0 else 0.0)


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
        if (self.waiting and not self._waiting_held()) or self._fresh or len(running) != decodes \
                or (engine is not None and engine.busy):
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

    def _prefill_jump_after(self, start: float, first_cost: float, base_cost: float, decodes: int,
                            held: int, before: int, take: int) -> None:
        """After a full prefill chunk on a dedicated GPU (no serving, admission or stall detector)
        that started at `start`: the further chunks that the same prompt takes whole, beside the
        same decodes. `base_cost`: the chunk's P(c) before context; `held`: the decodes' cached
        tokens and `before` the prompt's at that step; `take`: the prompt's tokens a step."""
        if self.engine is not None or self.admission is not None or self.stall is not None or self._fresh \
                or (self.waiting and not self._waiting_held()):
            return
        turn = next((t for t in self.running if t.prefill_left), None)
        if turn is None or turn.context - turn.prefill_left != before + take:
            return  # the chunk finished its prompt and went on to the next: a new batch
        if sum(1 for t in self.running if not t.prefill_left) != decodes:
            return  # a prompt's last chunk sampled its first token: one more decode from now
        n = (turn.prefill_left - 1) // take  # the chunk that ends the prompt is a regular step
        if decodes:
            n = min(n, min(t.out_left for t in self.running if not t.prefill_left) - 1)
        if self.kv_pool is not None and n > 0:
            n = self._pool_room(n, turn, take)
        if n <= 0:
            return
        ctx = self.context
        kv, ref = (ctx.kv_s_per_token, ctx.reference_context) if ctx else (0.0, 0)
        chunk_at = ctx.chunk_extra(take, before) if ctx else 0.0
        run = SilentRun("rollout", start + first_cost, base_cost + chunk_at, kv, held - decodes * ref, decodes,
                        slope=take * (take * ctx.attn_s_per_pair + kv) if ctx else 0.0, prefill=turn, take=take)
        self._start_run(run, n, self._quiet_until())

    def _waiting_held(self) -> bool:
        """Turns wait on a dedicated GPU that cannot start one before a turn finishes: its batch
        is full or the first's prompt does not fit its KV pool (running turns only grow it)."""
        if self.memory is not None or self.engine is not None:
            return False
        if len(self.running) >= self.max_running:
            return True
        t = self.waiting[0]
        return self.kv_pool is not None and bool(self.running) \
            and self.kv_used + -(-(t.context + 1) // BLOCK) > self.kv_pool

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
                self._land_rollout(k, run.end(upto - 1), run.prefill, run.take)
            else:
                self._land_serving(run, k, run.end(upto))
            run.landed = upto
        if upto == run.n:
            self._jump = None

    def _land_rollout(self, k: int, last_start: float, prefill=None, take: int = 0) -> None:
        """k steps each took a token of every decoding turn (and `take` of `prefill`'s prompt);
        the last began at `last_start`."""
        for t in self.running:
            if t is prefill:
                t.prefill_left -= k * take
            elif prefill is None or not t.prefill_left:
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
