"""The unified rollout proxy's wire types: one turn of one trajectory, asked and answered.

Dedicated rollout workers and co-serving workers both speak these, so the scheduler routes a
turn without knowing which kind of worker runs it.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TurnRequest:
    request_id: str  # unique per attempt: "<trajectory>/t<turn>/a<attempt>"
    trajectory_id: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    min_policy_version: int = 0  # the worker refuses if it holds an older policy
    run: str = ""  # the run whose policy must compute it; "" any (the worker refuses another run's)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"turn {self.request_id}: empty prompt")
        if self.max_tokens < 1:
            raise ValueError(f"turn {self.request_id}: max_tokens must be >= 1")

    def runs_on(self, held_run: str) -> bool:
        """Whether an engine holding `held_run`'s weights ("" a checkpoint's) may compute it:
        never on another run's weights."""
        return not self.run or not held_run or self.run == held_run


@dataclass
class TurnResult:
    request_id: str
    trajectory_id: str
    response_ids: list[int]
    logprobs: list[float]
    finished_reason: str  # "stop" (EOS), "length", "abort", "returned" (unstarted), "stale"
    worker: str = ""
    worker_kind: str = ""
    policy_version: int = -1
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    queued_s: float = 0.0  # waiting inside the worker before the first schedule
    prefill_s: float = 0.0  # scheduled -> first token
    decode_s: float = 0.0  # first token -> last token

    @property
    def ok(self) -> bool:
        return self.finished_reason in ("stop", "length")
