"""What long contexts add to a rollout engine step, beyond the latency profile's curves.

The GPU profiles time decode at 512 tokens of context per request and a prefill of L tokens
against nothing cached (sim/profiles/h100_*.json). An agentic turn at turn 20 decodes against
tens of thousands of cached tokens and prefills its new observation against them, which is where
long trajectories spend their time. Two roofline terms, each derived from published or measured
numbers (never fitted to a result):
- decode: every step reads each running request's whole KV cache once, so a batch holding C
  cached tokens beyond the profile's 512 per request reads (C - 512 B) x KV bytes/token more,
  at the device's published HBM bandwidth;
- chunked prefill: a chunk of c new tokens attends to the n tokens before it: 4 x layers x
  (heads x head_dim) FLOPs per (new, earlier) token pair (QK^T and AV, 2 FLOPs a MAC), at the
  effective FLOP rate the profile itself measured (2 x parameters x tokens over the monolithic
  curve's last segment), plus reading those n tokens' KV.
A profile without a bandwidth (the CPU models, whose contexts stay at a few hundred tokens) gets
no context term: ContextCost.none(). `python -m bench.sim.context_cost_check` times both against
a GPU (docs/results.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from executors.policies.latency_profile import LatencyProfile
from executors.policies.step_plan import StepPlan

REFERENCE_CONTEXT = 512  # tokens of context per request at which the GPU decode curves were timed


@dataclass(frozen=True)
class ContextCost:
    kv_s_per_token: float = 0.0  # seconds to read one cached token's KV (all layers)
    attn_s_per_pair: float = 0.0  # seconds of attention per (new token, earlier token) pair
    reference_context: int = REFERENCE_CONTEXT
    source: str = ""

    def __post_init__(self) -> None:
        if not (self.kv_s_per_token >= 0 and self.attn_s_per_pair >= 0 and self.reference_context >= 0):
            raise ValueError("context cost terms must be >= 0")
        if not (math.isfinite(self.kv_s_per_token) and math.isfinite(self.attn_s_per_pair)):
            raise ValueError("context cost terms must be finite")

    @classmethod
    def none(cls) -> "ContextCost":
        return cls(source="no context term (profile's curves alone)")

    @property
    def active(self) -> bool:
        return self.kv_s_per_token > 0 or self.attn_s_per_pair > 0

    def decode_extra(self, batch: int, context_tokens: int) -> float:
        """Seconds a decode step of `batch` requests holding `context_tokens` in all adds to D(B)."""
        return max(0, context_tokens - batch * self.reference_context) * self.kv_s_per_token

    def chunk_extra(self, tokens: int, before: int) -> float:
        """Seconds a prefill chunk of `tokens` new tokens after `before` cached ones adds."""
        if before <= 0:
            return 0.0
        return tokens * before * self.attn_s_per_pair + before * self.kv_s_per_token

    def priced(self, plan: StepPlan, decodes: int, held: int, before: int) -> StepPlan:
        """`plan` with what its context adds: the decodes' KV reads (`held` tokens in all) and, for
        a prefill chunk, attention to the `before` tokens cached ahead of it (-1: none pending)."""
        extra = self.decode_extra(decodes, held) if decodes else 0.0
        if plan.kind != "decode" and before >= 0:
            extra += self.chunk_extra(max(1, plan.tokens - decodes), before)
        if extra == 0:
            return plan
        # not dataclasses.replace: this runs for every simulated engine step
        return StepPlan(plan.kind, plan.tokens, plan.cost_s + extra, plan.blocks)

    @classmethod
    def derive(cls, profile: LatencyProfile, params: int, layers: int, q_dim: int,
               kv_bytes_per_token: int, bandwidth_tb_s: float, where: str = "") -> "ContextCost":
        """The two terms for a model of `params` parameters (`layers`, attention width `q_dim`,
        `kv_bytes_per_token`) on a device of `bandwidth_tb_s` TB/s HBM (cite it in `where`)."""
        if bandwidth_tb_s <= 0 or params <= 0 or layers <= 0 or q_dim <= 0 or kv_bytes_per_token <= 0:
            raise ValueError("bandwidth, parameters, layers, q_dim and KV bytes must be > 0")
        xs, ys = profile.monolithic.xs, profile.monolithic.lifted
        dt = ys[-1] - ys[-2]
        if dt <= 0:
            raise ValueError(f"profile {profile.name!r}: its longest prefills do not grow with length")
        flops_s = 2 * params * (xs[-1] - xs[-2]) / dt
        kv_s = kv_bytes_per_token / (bandwidth_tb_s * 1e12)
        attn_s = 4 * layers * q_dim / flops_s
        return cls(kv_s, attn_s, REFERENCE_CONTEXT,
                   f"KV reads {kv_bytes_per_token:,} B/token at {bandwidth_tb_s:g} TB/s ({where}); "
                   f"attention at {flops_s / 1e12:.0f} TFLOP/s effective (the profile's "
                   f"monolithic prefill {int(xs[-2])}->{int(xs[-1])} tokens)")
