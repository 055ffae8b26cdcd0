"""The rollout scheduler's settings, validated once (executors/scheduling/scheduler.py)."""
from __future__ import annotations

from dataclasses import dataclass

from executors.policies.router import MODES
from executors.policies.tail_handback import HandbackConfig


@dataclass(frozen=True)
class SchedulerConfig:
    cap_per_worker: int = 16  # turns in flight per dedicated rollout worker
    mode: str = "turnwise_affinity"  # routing: executors/policies/router.py MODES
    serving_max_turns: int = 16  # rollout turns queued on one serving worker, at most
    admission_refresh_s: float = 0.3  # how often a serving worker's admission is polled
    heartbeat_s: float = 0.5  # a dead worker is seen within this
    max_rejoins: int = 1  # times a worker that came back may rejoin the step
    max_attempts_per_turn: int = 5  # a turn rerouted more often fails its trajectory
    turn_timeout_s: float = 120.0  # health check: a batch unanswered this long
    stuck_after_s: float = 600.0  # no turn finished this long: RolloutStuck
    # fetching a finished batch's results; a worker that died holding them makes Dask
    # recompute the batch on that dead address, i.e. wait forever: rerouted instead
    result_timeout_s: float = 30.0
    max_batch_failures: int = 3  # failed batches before a worker is excluded
    # a borrowed serving worker may run a policy this many versions older than the step's
    # (its pull finishes in the background: weight_sync.policy_floor); dedicated ones may not
    serving_lag: int = 0
    # tail hand-back (executors/policies/tail_handback.py): a borrowed turn out longer than
    # this many dedicated median turn times, while nothing is queued and a dedicated worker
    # has room, is aborted on its serving worker and rerouted; 0 turns it off
    handback_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("cap_per_worker", "serving_max_turns", "max_attempts_per_turn",
                     "max_batch_failures"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("admission_refresh_s", "heartbeat_s", "turn_timeout_s", "stuck_after_s",
                     "result_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.handback_factor != 0:
            HandbackConfig(factor=self.handback_factor)  # raises on a bad factor
        if self.max_rejoins < 0 or self.serving_lag < 0:
            raise ValueError(f"max_rejoins and serving_lag must be >= 0, got {self.max_rejoins}, "
                             f"{self.serving_lag}")
