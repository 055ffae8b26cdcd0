"""A dedicated rollout GPU's own KV pool, as vLLM manages it: blocks grow with the tokens each
step writes, and when the pool runs out the youngest running request is preempted. A mixin of
Device (sim/device.py), which keeps `kv_pool` (blocks; None: unbounded), `kv_used` and each
turn's `blocks`."""
from __future__ import annotations

from sim.decode_jump import last_true
from sim.serving import BLOCK


class KVPool:
    def _grow_kv(self) -> None:
        """Blocks for the tokens the step wrote; when the pool runs out, vLLM preempts its youngest
        running request (recompute: its KV is dropped, its prompt and output so far prefilled
        again when it resumes, first in the queue)."""
        for t in self.running:  # t.kv_tokens + 1, inline: this runs for every simulated step
            need = -(-(t.context - t.prefill_left + t.response - t.out_left + 1) // BLOCK) - t.blocks
            if need > 0:
                self.kv_used += need
                t.blocks += need
        while self.kv_used > self.kv_pool and len(self.running) > 1:
            t = self.running.pop()
            self.kv_used -= t.blocks
            t.blocks, t.cached = 0, 0
            t.prefill_left = t.context + t.response - t.out_left
            t.context, t.response = t.prefill_left, t.out_left  # re-prefilled as a prompt
            self.waiting.insert(0, t)
            self.preempted += 1

    def _pool_room(self, n: int, prefill=None, take: int = 0) -> int:
        """The most further steps (<= n) after which the running turns' KV still fits the pool:
        each step adds a token to every decoding turn (and `take` to `prefill`'s prompt)."""
        def rate(t) -> int:
            if prefill is None:
                return 1
            return take if t is prefill else (0 if t.prefill_left else 1)

        rates = [(t, rate(t)) for t in self.running]
        # a turn holds the blocks of its tokens so far, so m steps add at most ceil(rate m / BLOCK)
        if self.kv_used + sum(-(-r * n // BLOCK) for _, r in rates) <= self.kv_pool:
            return n  # the common case, far from full: no turn's blocks need counting
        held = sum(t.blocks for t in self.running)

        def fits(m: int) -> bool:
            used = sum(max(t.blocks, -(-(t.kv_tokens + r * m + 1) // BLOCK)) for t, r in rates)
            return used - held + self.kv_used <= self.kv_pool

        return n if fits(n) else last_true(lambda m: m == 0 or fits(m), n)
