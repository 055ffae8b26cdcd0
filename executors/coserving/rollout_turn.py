"""One rollout turn inside the co-serving executor: its live record, its result, its counters.

RolloutSide (executors/coserving/rollout_side.py) keeps a `Turn` per request on the rollout
engine and answers each future with `turn_result`; a turn answered without running gets
`empty_result`. The counters outlive one rollout engine (the evict/reload baseline rebuilds it).
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from executors.turns import TurnRequest, TurnResult


# why a live turn was aborted -> its counter (every abort is answered "abort": the scheduler reroutes)
ABORTED = {"cut": "aborted_cut", "stall": "aborted_stall", "evict": "aborted_evict",
           "other": "aborted_other"}


def new_counters() -> dict:
    """Rollout counters; they outlive one engine (the evict/reload baseline rebuilds it)."""
    keys = ("finished", "tokens", "steps", "planned_steps", *ABORTED.values(), "stale",
            "leases_expired", "lease_blocks_evicted", "prefixes_dropped", "leases_reclaimed",
            "cached_tokens", "scheduled_tokens", "empty_steps", "stall_kept",
            # every abort above is one of these two: work thrown away, or a turn handed back
            # before the engine computed any of it (nothing lost: the scheduler reroutes it)
            "aborted_started", "returned_unstarted",
            "start_declined")  # handed back at the door: recent slack says it would not finish
    c: dict = dict.fromkeys(keys, 0)
    c.update(step_s=0.0, planned_step_s=0.0, predicted_s=0.0, abs_error_s=0.0)
    return c


def empty_result(request: TurnRequest, worker: str, version: int, reason: str) -> TurnResult:
    """A turn answered without tokens: "abort" (reroutable), "returned" (handed back before
    anything ran: reroutable, no attempt lost) or "stale" (old weights)."""
    return TurnResult(request.request_id, request.trajectory_id, [], [], reason, worker,
                      "serving", version, len(request.prompt_ids))


@dataclass
class Turn:
    """A live turn on the rollout engine: what it produced so far and when."""
    request: TurnRequest
    fut: Future
    internal: str
    submitted: float
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    computed: int = 0
    pages: int = 0
    cached: int = 0
    first_progress: float | None = None  # None: the engine computed nothing of it yet

    @property
    def started(self) -> bool:
        return self.first_progress is not None
    first_token_at: float | None = None
    last_token_at: float | None = None


def turn_result(t: Turn, worker: str, version: int, reason: str) -> TurnResult:
    """The turn's tokens and its queue / prefill / decode times."""
    res = empty_result(t.request, worker, version, reason)
    res.response_ids, res.logprobs, res.num_cached_tokens = t.ids, t.logprobs, t.cached
    start = t.first_progress or t.submitted
    res.queued_s = max(0.0, start - t.submitted)
    if t.first_token_at is not None:
        res.prefill_s = max(0.0, t.first_token_at - start)
        res.decode_s = max(0.0, (t.last_token_at or t.first_token_at) - t.first_token_at)
    return res
