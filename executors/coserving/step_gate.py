"""Whether the co-serving executor runs a rollout step now, and under which KV cap.

A mixin of CoServingExecutor (executors/coserving/executor.py), run on its loop thread. In
"rose" mode a rollout step runs only if DualSLOAdmission admits its predicted cost (the
rollout profile's price of the plan: the chunk it will schedule, else the decode step of its
batch) and the KV policy grants its blocks. KV is one emulated device pool of `total` pages
(page = serving block); each engine's BudgetedScheduler gets a block cap so serving + rollout
never exceed it (CPU has no VMM).
"""
from __future__ import annotations

import math

from executors.policies.kv_memory import MemoryState
from executors.policies.slo_admission import DualSLOAdmission
from executors.policies.step_plan import StepPlan

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
        a.slowdown = getattr(getattr(self, "admission", None), "slowdown", 1.0)  # a new SLO, same device
        return a

    def observe_step(self, plan: StepPlan | None, took_s: float) -> None:
        """A rollout step ran: how much slower than its profile the device is now (shared CPU
        cores, a neighbour on the GPU) scales every prediction admission makes."""
        if plan is None or plan.cost_s <= 0 or not self.wiring.admission:
            return
        a = self.admission
        ratio = min(max(took_s / plan.cost_s, SLOWDOWN_RANGE[0]), SLOWDOWN_RANGE[1])
        a.slowdown = (1 - SLOWDOWN_EWMA) * a.slowdown + SLOWDOWN_EWMA * ratio

    def note_serving_prompt(self, prompt_len: int) -> None:
        self.recent_prompts.append(prompt_len)
        self.admission.arrival_prompt_len = self._arrival_len()

    def _arrival_len(self) -> int:
        xs = sorted(self.recent_prompts)
        return xs[min(len(xs) - 1, int(ARRIVAL_QUANTILE * len(xs)))] if xs else 0

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
        if self.wiring.admission and chunk and plans and plans[0].kind == "prefill_chunk":
            # smaller chunks after the full one: a chunk that fits the slack beats decodes only
            # (or nothing) when the SLO is tight
            plans[1:1] = [p for c in (chunk // 2, chunk // 4, chunk // 8) for p in r.plans(c, room, admit)
                          if p.kind == "prefill_chunk" and p.tokens < plans[0].tokens]
        if r.blocked_room is not None and room <= r.blocked_room and now < r.blocked_until:
            plans = []  # the last step under this much room scheduled nothing
        denied = self.counters["denied"]
        if not plans:  # nothing fits the KV room (or nothing to schedule): wait
            denied["kv_headroom"] = denied.get("kv_headroom", 0) + 1
            return None
        if not self.wiring.admission:
            return plans[0], cap
        reason = "kv_headroom"
        queued, active = self.serving.queued_prefills(), self.serving.active_decodes()
        for plan in plans:
            # plans fit the room the policy grants (budget and reserve kept; a "preempt" step
            # takes no more than that room): the cap holds every step to it
            kv_ok = self.policy.state is not MemoryState.PRESSURE and plan.blocks <= room
            d = self.admission.admit(plan.cost_s * self.admission.slowdown, queued, active, now, kv_ok)
            if d.admitted:
                self.counters["admitted"] += 1
                return plan, cap
            reason = d.reason
        denied[reason] = denied.get(reason, 0) + 1
        if reason in ("ttft_slack", "tpot_slack"):  # serving's burst, not KV: stalls may wait
            r.slack_denied_at = now
        return None

    def _would_admit(self, now: float) -> bool:
        r = self.rollout
        if r is None or len(r.live) >= self.cfg.max_num_seqs:
            return False
        if self.policy is not None and r.room_pages(with_leases=True) < r.pages(1):
            return False
        if not self.wiring.admission:
            return True
        queued = self.serving.queued_prefills()
        slack = min(self.admission.ttft_slack(queued, now),
                    self.admission.tpot_slack(self.serving.active_decodes(), now, queued))
        return self.admission.slowdown * self.rollout_profile.decode_step(len(r.live) + 1) <= slack
