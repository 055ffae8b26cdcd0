"""The serving engine of one simulated device: its request queue, its running batch, its KV.

A serving step runs the queued prefills monolithic together with the decodes (P_serving of their
summed prompts, up to MAX_SERVING_PREFILL tokens), else one decode step D_serving(B); every
running request emits one token per step, a prefilled one its first.

Kept in O(1) per step, not O(batch), because at 1,024 GPUs serving steps are most of the
simulator's events: every running request's latest token came out at the end of the same
(last) step, so one timestamp stands for all; a request's last token is due at a known step
count, so requests are filed by it; and its KV blocks grow by one exactly when its token count
passes a multiple of BLOCK, which depends only on (tokens - step count) mod BLOCK, so a count
per residue says how many blocks the next step opens. The numbers are those of walking the
batch every step (the JSON outputs of bench/cluster_sim.py are identical before and after).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from executors.policies.latency_profile import LatencyProfile
from executors.policies.slo_admission import ServingDecode, ServingPrefill
from sim.workload import ServingRequest

BLOCK = 32  # tokens per KV block (executors/coserving/config.py BLOCK_SIZE)
MAX_SERVING_PREFILL = 4096  # serving prompt tokens batched in one step (vLLM max_num_batched_tokens)


@dataclass(slots=True)
class _Serve:
    req: ServingRequest
    first: float = 0.0  # when its first token came out
    phase: int = 0  # (tokens - step count) mod BLOCK: the step that opens its next block
    prefill: ServingPrefill | None = None  # its admission view while queued, made once


@dataclass
class ServingStats:
    done: list[tuple[float, float]] = field(default_factory=list)  # (TTFT, TPOT) per finished request
    busy_s: float = 0.0


class ServingEngine:
    def __init__(self, profile: LatencyProfile, arrivals: Iterator[ServingRequest]) -> None:
        self.profile = profile
        self._arrivals = arrivals
        self.next: ServingRequest | None = next(arrivals, None)
        self.queued: list[_Serve] = []
        self.running = 0  # requests in decode
        self.blocks = 0  # KV blocks the running requests hold
        self.last_token_at = 0.0  # every running request's latest token: the last step's end
        self.stats = ServingStats()
        self._steps = 0
        self._due: dict[int, list[_Serve]] = {}  # step count -> requests whose last token it emits
        self._phases = [0] * BLOCK  # running requests per phase
        self._decode: dict[int, float] = {}  # batch size -> D(B)

    @property
    def busy(self) -> bool:
        return bool(self.queued) or self.running > 0

    def take_arrivals(self, now: float) -> None:
        nxt = self.next
        while nxt is not None and nxt.arrival <= now:
            self.queued.append(_Serve(nxt))
            nxt = next(self._arrivals, None)
        self.next = nxt

    def step(self, now: float) -> float:
        """Run one serving step from `now` (the caller checked `busy`); its seconds."""
        g = self._steps = self._steps + 1
        if not self.queued:  # a decode step, the common case: D(B) remembered per batch size
            cost = self.decode_cost()
            end = self.last_token_at = now + cost
            self.blocks += self._phases[(1 - g) % BLOCK]  # running requests whose token opens a block
            if g in self._due:
                self._retire(self._due.pop(g), end)
            return cost
        batch, tokens = [], 0
        for s in self.queued:
            if batch and tokens + s.req.prompt > MAX_SERVING_PREFILL:
                break
            batch.append(s)
            tokens += s.req.prompt
        del self.queued[:len(batch)]
        cost = self.profile.prefill(tokens)
        end = self.last_token_at = now + cost
        self.blocks += self._phases[(1 - g) % BLOCK]
        for s in batch:  # prefilled: its first token, prompt + 1 tokens in KV
            s.first, s.phase = end, (s.req.prompt + 1 - g) % BLOCK
            self._phases[s.phase] += 1
            self.blocks += math.ceil((s.req.prompt + 1) / BLOCK)
            self._due.setdefault(g + max(0, s.req.output - 1), []).append(s)
        self.running += len(batch)
        done = self._due.pop(g, None)
        if done:
            self._retire(done, end)
        return cost

    def decode_cost(self) -> float:
        """D(B) of the running batch (remembered per batch size, as `step` does)."""
        cost = self._decode.get(self.running)
        if cost is None:
            cost = self._decode[self.running] = self.profile.decode_step(self.running)
        return cost

    def steps_to_retire(self) -> int:
        """Decode steps before the one that emits some running request's last token."""
        return min(self._due) - self._steps - 1 if self._due else 0

    def blocks_after(self, k: int) -> int:
        """KV blocks after k more decode steps that retire nothing: step g opens the blocks of
        the requests whose phase is (1 - g) mod BLOCK, so every BLOCK steps open one each."""
        g, phases = self._steps, self._phases
        part = sum(phases[(1 - g - i) % BLOCK] for i in range(1, k % BLOCK + 1)) if k % BLOCK else 0
        return self.blocks + (k // BLOCK) * self.running + part

    def blocks_bound(self, k: int) -> int:
        """At least blocks_after(k), in O(1)."""
        return self.blocks + (k // BLOCK + 1) * self.running

    def silent_decodes(self, k: int, end: float) -> None:
        """k decode steps that retire nothing, the last ending at `end` (sim/decode_jump.py)."""
        self.blocks = self.blocks_after(k)
        self._steps += k
        self.last_token_at = end

    def _retire(self, done: list[_Serve], end: float) -> None:
        """Requests whose last token came out at `end`: free their KV, record TTFT and TPOT."""
        self.running -= len(done)
        for s in done:
            self._phases[s.phase] -= 1
            self.blocks -= math.ceil((s.req.prompt + s.req.output) / BLOCK)
            self.stats.done.append((s.first - s.req.arrival, (end - s.first) / max(1, s.req.output - 1)))

    def admission_view(self) -> tuple[list[ServingPrefill], list[ServingDecode]]:
        """What DualSLOAdmission holds a rollout step against: queued prefills, running decodes
        (one shared view: their latest tokens all came out at the last step's end)."""
        for s in self.queued:
            if s.prefill is None:
                s.prefill = ServingPrefill(s.req.arrival, s.req.prompt)
        return [s.prefill for s in self.queued], [ServingDecode(self.last_token_at)] * self.running
