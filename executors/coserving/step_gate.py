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
from executors.policies.step_plan import StepPlan


class StepGate:
    """Caps and the admit / deny decision; reads the executor's sides, policies and wiring."""

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
            d = self.admission.admit(plan.cost_s, queued, active, now, kv_ok)
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
        slack = min(self.admission.ttft_slack(self.serving.queued_prefills(), now),
                    self.admission.tpot_slack(self.serving.active_decodes(), now))
        return self.rollout_profile.decode_step(len(r.live) + 1) <= slack
