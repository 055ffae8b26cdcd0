"""Whether the co-serving executor runs a rollout step now, and under which KV cap.

A mixin of CoServingExecutor (executors/coserving/executor.py), run on its loop thread. In
"rose" mode a rollout step runs only if DualSLOAdmission admits its predicted cost (the
rollout profile's price of the plan: the chunk it will schedule, else the decode step of its
batch) and the KV policy grants its blocks. When the full step does not fit the slack, smaller
ones are tried, largest first (executors/policies/step_plan.py smaller_steps), and the cost held
against the slack is the step's P99, not its mean: the prediction times the P99 of how much
longer rollout steps ran than predicted, beyond what serving steps see (prediction_margin.py). A new
turn starts only when recent slack says it will finish (turn_start.py); otherwise it is handed
back unstarted. KV is one emulated device pool of `total` pages
(page = serving block); each engine's BudgetedScheduler gets a block cap so serving + rollout
never exceed it (CPU has no VMM).
"""
from __future__ import annotations

import math

from executors.policies.kv_memory import MemoryState
from executors.policies.prediction_margin import nearest_rank
from executors.policies.slo_admission import DualSLOAdmission
from executors.policies.step_plan import SIZE_FLOOR_EFFICIENCY, StepPlan, smaller_steps
from executors.turns import TurnRequest

ARRIVAL_QUANTILE = 0.9  # the TTFT slack holds for a new arrival this long among recent prompts
SLOWDOWN_EWMA = 0.1  # weight of the newest rollout step in the measured / profiled time ratio
SLOWDOWN_RANGE = (0.5, 8.0)  # one freak step (a page fault, a GC) must not swing it further


class StepGate:
    """Caps and the admit / deny decision; reads the executor's sides, policies and wiring."""

    def new_admission(self) -> DualSLOAdmission:
        """The dual-SLO gate for the current SLO: it also protects a serving request arriving
        during the rollout step (a recent-prompt-length arrival) and counts the queued serving
        prefills in the next serving step, both needed at an SLO of 2x serving-alone P99."""
        a = DualSLOAdmission(self.serving_profile, self.slo, "mixed", "monolithic",
                             arrival_prompt_len=self._arrival_len(), next_step_prefills=True)
        self._price_serving(a)
        return a

    def _price_serving(self, a: DualSLOAdmission) -> None:
        """Admission prices serving steps with what serving steps measured: their slowdown and
        the P99 of their overrun."""
        a.slowdown = self.serving_slowdown
        a.serving_tail = max(1.0, self.serving_margin.tail() or 1.0)

    def observe_step(self, plan: StepPlan | None, took_s: float) -> None:
        """A rollout step ran: how much slower than its profile rollout steps run now (shared
        CPU cores, a neighbour on the GPU) scales the rollout costs admission holds; how far it
        overran what admission predicted feeds the margin."""
        if plan is None or plan.cost_s <= 0 or not self.wiring.admission:
            return
        self.margin.observe(plan.cost_s * self.rollout_slowdown, took_s)  # before the slowdown moves
        self.rollout_slowdown = _ewma(self.rollout_slowdown, took_s / plan.cost_s)

    def serving_step_cost(self) -> float:
        """The serving profile's price of the next serving step: D(B) for the decodes plus the
        queued prefills vLLM batches with them (0 with nothing to do)."""
        queued, active = self.serving.queued_prefills(), self.serving.active_decodes()
        cost = self.serving_profile.decode_step(len(active)) if active else 0.0
        return cost + sum(self.serving_profile.prefill(r.prompt_len) for r in queued)

    def observe_serving_step(self, predicted_s: float, took_s: float) -> None:
        """A serving step ran: its own slowdown, what serving alone gets from this device. It
        scales admission's serving predictions (the next serving step, an arrival's prefill)
        and the endpoint judges refusals by it. Rollout's is its own: the two engines' profiles
        are off by different factors (measured: 2.0 for rollout steps, 0.7 for serving's)."""
        if predicted_s <= 0:
            return
        self.serving_margin.observe(predicted_s * self.serving_slowdown, took_s)
        self.serving_slowdown = _ewma(self.serving_slowdown, took_s / predicted_s)
        self._price_serving(self.admission)

    def p99_cost(self, predicted_s: float) -> float:
        """What admission holds against the slack for a step the profile prices at
        `predicted_s`: scaled by the measured slowdown and the P99 overrun factor (rollout
        steps' tail beyond serving steps')."""
        return predicted_s * self.rollout_slowdown * self.margin.factor(self.serving_margin)

    def turn_work_s(self, request: TurnRequest) -> float:
        """Seconds of rollout steps a turn needs on this device: its uncached prompt in chunks
        (a leased prefix counts as cached) and max_tokens decode steps at the batch it joins."""
        r, prof = self.rollout, self.rollout_profile
        leased = len(r.lease_blocks.get(request.trajectory_id, ())) * r.scheduler.block_size
        todo = max(1, len(request.prompt_ids) - leased)
        full, rest = divmod(todo, prof.chunk_size)
        prefill = full * prof.chunk(prof.chunk_size) + (prof.chunk(rest) if rest else 0.0)
        decode = request.max_tokens * prof.decode_step(min(len(r.live) + 1, self.cfg.max_num_seqs))
        return self.p99_cost(prefill + decode)

    def should_start(self, request: TurnRequest, now: float) -> bool:
        """Start this turn now, or hand it back unstarted (serving leaves it too little slack)."""
        if not self.wiring.admission:
            return True
        work = self.turn_work_s(request)
        self._turn_work = work
        return self.turn_gate.should_start(now, work)

    def note_serving_prompt(self, prompt_len: int) -> None:
        self.recent_prompts.append(prompt_len)
        self.admission.arrival_prompt_len = self._arrival_len()

    def _arrival_len(self) -> int:
        return int(nearest_rank(sorted(self.recent_prompts), ARRIVAL_QUANTILE)) if self.recent_prompts else 0

    def _serving_cap(self) -> int | None:
        """Serving's share of the emulated device pool: what rollout does not hold."""
        if self.rollout is None:
            return None
        if self.wiring.static_share is not None:
            return self.total - math.floor(self.total * self.wiring.static_share)
        held = (self.policy.rollout_used if self.policy is not None
                else self.rollout.pages(self.rollout.used_blocks()))
        return max(0, self.total - held)

    def _rollout_cap(self) -> int:
        r = self.rollout
        if self.policy is not None:
            return r.used_blocks() + r.blocks_for(r.room_pages())
        share = 1.0 if self.wiring.static_share is None else self.wiring.static_share
        return r.blocks_for(math.floor(self.total * share))

    def _decide(self, now: float) -> tuple[StepPlan, int] | None:
        """(plan, block cap) of the rollout step to run now, or None (not admitted)."""
        r, chunk = self.rollout, self.cfg.chunk_tokens if self.wiring.chunked else None
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
        if self.wiring.admission and plans:
            plans = self._sized(plans, chunk, room, admit)
        if r.blocked_room is not None and room <= r.blocked_room and now < r.blocked_until:
            plans = []  # the last step under this much room scheduled nothing
        denied = self.counters["denied"]
        if not plans:  # nothing fits the KV room (or nothing to schedule): wait
            denied["kv_headroom"] = denied.get("kv_headroom", 0) + 1
            return None
        if not self.wiring.admission:
            return plans[0], cap
        reason = "kv_headroom"
        if now < self.yield_until:  # a user was at the door: serving first, nothing runs
            denied["yielded"] = denied.get("yielded", 0) + 1
            r.slack_denied_at = now
            return None
        queued, active = self.serving.queued_prefills(), self.serving.active_decodes()
        for plan, size in plans:
            # plans fit the room the policy grants (budget and reserve kept; a "preempt" step
            # takes no more than that room): the cap holds every step to it
            kv_ok = self.policy.state is not MemoryState.PRESSURE and plan.blocks <= room
            d = self.admission.admit(self.p99_cost(plan.cost_s), queued, active, now, kv_ok)
            if d.admitted:
                self.counters["admitted"] += 1
                key = f"{plan.kind} {size}"
                self.counters["step_sizes"][key] = self.counters["step_sizes"].get(key, 0) + 1
                return plan, cap
            reason = d.reason
        denied[reason] = denied.get(reason, 0) + 1
        if reason in ("ttft_slack", "tpot_slack"):  # serving's burst, not KV: stalls may wait
            r.slack_denied_at = now
        return None

    def _sized(self, plans: list[StepPlan], chunk: int | None, room: int,
               admit: int) -> list[tuple[StepPlan, str]]:
        """Each plan then its smaller versions, labelled by size ("full", "1/2", ...): a step that
        fits the slack beats none when the SLO is tight. Prefill chunks are re-planned at half,
        a quarter, an eighth of the chunk (their KV need shrinks with them); decode steps run
        part of the batch. Both stop at the efficiency floor (step_plan.smaller_steps) while serving
        has work; with serving idle there is none."""
        r, out = self.rollout, []
        # Waiting is cheaper than a tiny step only where the slack will grow: with serving idle
        # it is the standing guard for an arrival, which waiting does not raise, so no floor.
        floor = 0.0 if not self.serving.has_work() else SIZE_FLOOR_EFFICIENCY
        for plan in plans:
            out.append((plan, "full"))
            if plan.kind == "prefill_chunk" and chunk:
                smallest = [p.tokens for p in smaller_steps(plan, self.rollout_profile, chunk, floor)]
                for c in (chunk // 2, chunk // 4, chunk // 8):
                    out += [(p, _fraction(p.tokens, plan.tokens)) for p in r.plans(c, room, admit)
                            if p.kind == "prefill_chunk" and p.tokens < plan.tokens
                            and smallest and p.tokens >= smallest[-1]]
            elif plan.kind == "decode":
                out += [(p, _fraction(p.tokens, plan.tokens))
                        for p in smaller_steps(plan, self.rollout_profile, chunk, floor)]
        return out

    def _slack_now(self, now: float) -> float:
        queued, active = self.serving.queued_prefills(), self.serving.active_decodes()
        return min(self.admission.ttft_slack(queued, now, active),
                   self.admission.tpot_slack(active, now, queued))

    def _observe_turn_gate(self, now: float, slack: float, ran: bool) -> None:
        """Whether rollout got the device this iteration (`ran`) or its smallest step could run
        now (`slack`: _slack_now's): the turn start gate's history. A step that just ran spent
        the slack it found, so the slack after it says nothing about the share rollout gets."""
        if self.rollout is None or not self.wiring.admission:
            return
        could = ran or (now >= self.yield_until
                        and self.p99_cost(self.rollout_profile.decode_step(1)) <= slack)
        self.turn_gate.observe(now, could)

    def _would_admit(self, now: float, slack: float | None = None) -> bool:
        r = self.rollout
        if r is None or len(r.live) >= self.cfg.max_num_seqs:
            return False
        if self.policy is not None and r.room_pages(with_leases=True) < r.pages(1):
            return False
        if not self.wiring.admission:
            return True
        if now < self.yield_until or not self.turn_gate.should_start(now, self._turn_work):
            return False  # a new turn would be handed back: do not send one
        slack = self._slack_now(now) if slack is None else slack
        return self.p99_cost(self.rollout_profile.decode_step(len(r.live) + 1)) <= slack


def _ewma(current: float, ratio: float) -> float:
    """The slowdown after one more measured / profiled step time, the ratio clipped: one freak
    step (a page fault, a GC) must not swing it further."""
    ratio = min(max(ratio, SLOWDOWN_RANGE[0]), SLOWDOWN_RANGE[1])
    return (1 - SLOWDOWN_EWMA) * current + SLOWDOWN_EWMA * ratio


def _fraction(part: int, whole: int) -> str:
    """A smaller step's size as the nearest power-of-two fraction of the full one ("1/2")."""
    k = max(1, round(math.log2(max(1.0, whole / max(1, part)))))
    return f"1/{2 ** k}"
