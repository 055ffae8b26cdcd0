"""What the next rollout engine step will do, and what it costs: the input of admission.

Plain Python (rose.md component 1): from the rollout engine's pending work (requests in
decode, prompt tokens still to prefill, decodes that start a new KV block) and its latency
profile, the step's token budget, predicted seconds and KV blocks. A prefill step is one chunk
(P_chunked(c)), mixed with the pending decodes as vLLM batches them; without prefill the step
is a decode step of the batch (D(b)). A tight KV room shrinks the chunk to whole blocks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from executors.latency_profile import LatencyProfile
from executors.slo_admission import rollout_step_cost


@dataclass(frozen=True)
class StepPlan:
    kind: str  # "prefill_chunk" or "decode"
    tokens: int  # the step's token budget
    cost_s: float  # predicted seconds the step holds the device
    blocks: int  # KV blocks it may newly need (upper bound, ignoring prefix hits)


def plan_steps(decodes: int, prefill: int, boundary: int, block_size: int,
               profile: LatencyProfile, chunk_tokens: int | None,
               room_blocks: int | None = None) -> list[StepPlan]:
    """The next step's plan, then a decode-only fallback when prefill is pending.

    chunk_tokens None: vLLM's full budget (monolithic prefill: the SLO-unaware baseline).
    room_blocks: blocks the memory policy still grants (None: unlimited).
    """
    if min(decodes, prefill, boundary) < 0 or block_size < 1:
        raise ValueError("pending work must be >= 0 and block_size >= 1")
    decode = None
    if decodes:
        decode = StepPlan("decode", decodes, rollout_step_cost("decode", decodes, profile), boundary)
    n = decodes + prefill if chunk_tokens is None else min(chunk_tokens, decodes + prefill)
    if room_blocks is not None:
        n = min(n, decodes + (room_blocks - 1 - boundary) * block_size)
    if not prefill or n <= decodes:
        return [decode] if decode else []
    if chunk_tokens is None:
        cost = profile.prefill(n, "monolithic")
    else:
        cost = profile.chunk(min(n, profile.chunk_size))
    # the chunk's prefill tokens may straddle one more block; block-boundary decodes need theirs
    full = StepPlan("prefill_chunk", n, cost, math.ceil((n - decodes) / block_size) + 1 + boundary)
    return [full, decode] if decode else [full]


def blocks_wanted(decodes: int, prefill: int, boundary: int, block_size: int,
                  chunk_tokens: int | None) -> int:
    """Blocks the next full step may need (a whole chunk plus block-boundary decodes)."""
    n = decodes + prefill if chunk_tokens is None else min(chunk_tokens, decodes + prefill)
    return math.ceil(max(0, n - decodes) / block_size) + (1 if prefill else 0) + boundary
