"""What one rollout phase hands back: the kept trajectories and what happened to the workers."""
from __future__ import annotations

from dataclasses import dataclass, field

from executors.scheduling.episode import Episode


class RolloutStuck(RuntimeError):
    """No worker is left to run the remaining turns (all dead, excluded or stuck)."""


@dataclass
class RolloutReport:
    episodes: list[Episode]  # the trajectories kept for the step
    seconds: float
    rerouted_turns: int = 0
    dead_workers: list[str] = field(default_factory=list)
    excluded_workers: list[str] = field(default_factory=list)  # stale or failing, not dead
    rejoined_workers: list[str] = field(default_factory=list)
    batches: int = 0
    aborted_turns: int = 0  # surplus turns aborted in engines (dynamic sampling)
    interrupted: dict[str, int] = field(default_factory=dict)  # worker -> turns it aborted (rerouted)
    handed_back: int = 0  # borrowed turns taken back for idle dedicated workers (tail hand-back)
    returned_unstarted: int = 0  # turns a serving worker handed back before running (rerouted)
    sampling: dict = field(default_factory=dict)
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (unix time, what, worker)

    @property
    def rows(self) -> list[dict]:
        return [row for ep in self.episodes for row in ep.rows]
