"""DAPO dynamic sampling (redundant sampling) as a launch policy for one RL step.

A group (trajectories sharing an initial state) teaches GRPO/DAPO something only when its rewards
differ: a group "counts" when its rewards have non-zero variance. The step keeps launching groups
until `target_groups` counting groups are done, then aborts the surplus still in flight.

Keep-rate estimate (used to size launches), a Beta-smoothed fraction so it is never 0 or 1:
    rate = (kept + PRIOR_WEIGHT * prior) / (done + PRIOR_WEIGHT)
with `prior` the rate the step was launched with (by default target_groups / initial_launch) and
PRIOR_WEIGHT = 2 pseudo-groups, so a few early outcomes move it but do not swing it to 0.

Launch rule, within the step: launch more while the groups kept so far plus the groups expected
from those in flight (rate * in_flight) fall short of the target; the shortfall divided by the
rate, rounded up, is how many more to launch. Never more than `max_launch` groups in all.

Next step's concurrency target: ceil(target_groups / rate) with this step's observed rate,
clamped to [target_groups, max_launch], so a step that kept few groups launches more up front
next time and one that kept nearly all launches close to the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

PRIOR_WEIGHT = 2.0


def counts(rewards: Sequence[float]) -> bool:
    """A group counts for the batch when its rewards are not all equal (non-zero variance)."""
    if len(rewards) < 2:
        raise ValueError(f"a group needs at least 2 rewards to have a variance, got {len(rewards)}")
    if any(math.isnan(r) for r in rewards):
        raise ValueError("group rewards contain NaN")
    return max(rewards) > min(rewards)


@dataclass
class DynamicSampler:
    target_groups: int
    initial_launch: int
    max_launch: int | None = None  # safety bound on groups launched in one step; default 4x initial
    prior_keep_rate: float | None = None  # default target_groups / initial_launch
    _launched: dict[int, None] = field(default_factory=dict, init=False, repr=False)
    _in_flight: dict[int, None] = field(default_factory=dict, init=False, repr=False)
    _kept: list[int] = field(default_factory=list, init=False, repr=False)
    _dropped: list[int] = field(default_factory=list, init=False, repr=False)
    _aborted: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.target_groups < 1:
            raise ValueError(f"target_groups must be >= 1, got {self.target_groups}")
        if self.initial_launch < self.target_groups:
            raise ValueError(
                f"initial_launch ({self.initial_launch}) must be >= target_groups ({self.target_groups})"
            )
        if self.max_launch is None:
            self.max_launch = 4 * self.initial_launch
        if self.max_launch < self.initial_launch:
            raise ValueError(
                f"max_launch ({self.max_launch}) must be >= initial_launch ({self.initial_launch})"
            )
        if self.prior_keep_rate is None:
            self.prior_keep_rate = self.target_groups / self.initial_launch
        if not 0.0 < self.prior_keep_rate <= 1.0:
            raise ValueError(f"prior_keep_rate must be in (0, 1], got {self.prior_keep_rate}")

    # -- launching -------------------------------------------------------------------------------
    def to_launch(self) -> int:
        """How many more groups to launch now (the initial launch first, then top-ups)."""
        if not self._launched:
            return self.initial_launch
        if self.target_reached:
            return 0
        shortfall = self.target_groups - len(self._kept) - self.keep_rate * len(self._in_flight)
        if shortfall <= 1e-9:
            return 0
        budget = self.max_launch - len(self._launched)
        return max(0, min(budget, math.ceil(shortfall / self.keep_rate - 1e-9)))

    def should_launch_more(self) -> bool:
        return self.to_launch() > 0

    def on_group_launched(self, group_id: int) -> None:
        if group_id in self._launched:
            raise ValueError(f"group {group_id} was already launched")
        if len(self._launched) >= self.max_launch:
            raise ValueError(f"launch budget of {self.max_launch} groups is spent")
        self._launched[group_id] = None
        self._in_flight[group_id] = None

    # -- outcomes --------------------------------------------------------------------------------
    def on_group_done(self, group_id: int, rewards: Sequence[float]) -> bool:
        """Record a finished group; return whether it counts (non-zero reward variance)."""
        if group_id not in self._in_flight:
            raise ValueError(f"group {group_id} is not in flight")
        keep = counts(rewards)
        del self._in_flight[group_id]
        (self._kept if keep else self._dropped).append(group_id)
        return keep

    def surplus_to_abort(self) -> list[int]:
        """Once the target is reached, every group still in flight is surplus; else nothing."""
        return list(self._in_flight) if self.target_reached else []

    def on_group_aborted(self, group_id: int) -> None:
        if group_id not in self._in_flight:
            raise ValueError(f"group {group_id} is not in flight")
        del self._in_flight[group_id]
        self._aborted.append(group_id)

    # -- state -----------------------------------------------------------------------------------
    @property
    def target_reached(self) -> bool:
        return len(self._kept) >= self.target_groups

    @property
    def exhausted(self) -> bool:
        """Budget spent and nothing in flight, short of the target: train on what was kept."""
        return (
            not self.target_reached and not self._in_flight and len(self._launched) >= self.max_launch
        )

    @property
    def keep_rate(self) -> float:
        done = len(self._kept) + len(self._dropped)
        return (len(self._kept) + PRIOR_WEIGHT * self.prior_keep_rate) / (done + PRIOR_WEIGHT)

    def batch(self) -> list[int]:
        """The groups to train on: the first `target_groups` counting groups, in finishing order."""
        return self._kept[: self.target_groups]

    def next_step_launch(self) -> int:
        """Groups to launch up front next step: ceil(target / keep_rate), clamped (see module doc)."""
        wanted = math.ceil(self.target_groups / self.keep_rate - 1e-9)
        return max(self.target_groups, min(self.max_launch, wanted))

    def summary(self) -> dict[str, float | int]:
        return {
            "target_groups": self.target_groups,
            "launched": len(self._launched),
            "kept": len(self._kept),
            "dropped": len(self._dropped),
            "aborted": len(self._aborted),
            "in_flight": len(self._in_flight),
            "keep_rate": self.keep_rate,
            "next_step_launch": self.next_step_launch(),
        }
