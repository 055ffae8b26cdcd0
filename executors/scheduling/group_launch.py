"""Which GRPO groups a step runs: all at once, or DAPO dynamic sampling (redundant sampling).

Without a sampler every group starts at once and every group is kept. With one
(executors/policies/dynamic_sampling.py), the launcher starts `sampler.to_launch()` groups, tops up as
groups finish without reward variance, and once the target count of varied groups is reached
names the trajectories still running as surplus: the scheduler aborts their turns and they
never reach the Arrow step. If the launch budget runs out short of the target, the step keeps
what it has and fills up to the target with finished zero-variance groups (advantage 0: no
gradient, but the batch keeps its shape and every group stays complete).
"""
from __future__ import annotations

from typing import Callable

from executors.policies.dynamic_sampling import DynamicSampler
from executors.scheduling.episode import Episode


class GroupLauncher:
    def __init__(self, make_group: Callable[[int], list[Episode]], groups: int,
                 sampler: DynamicSampler | None = None, group_ids: list[int] | None = None) -> None:
        if groups < 1:
            raise ValueError(f"a step needs >= 1 group, got {groups}")
        if sampler is not None and sampler.target_groups != groups:
            raise ValueError(f"sampler targets {sampler.target_groups} groups, step wants {groups}")
        self.make_group, self.groups, self.sampler = make_group, groups, sampler
        self._ids = list(group_ids) if group_ids is not None else list(range(groups))
        self._episodes: dict[int, list[Episode]] = {}
        self._done: dict[int, int] = {}  # group -> trajectories finished
        self._aborted: set[int] = set()
        self._finished_order: list[int] = []

    @classmethod
    def fixed(cls, episodes: list[Episode]) -> "GroupLauncher":
        """The given episodes, all at once, all kept (a plain step)."""
        by_group: dict[int, list[Episode]] = {}
        for ep in episodes:
            by_group.setdefault(ep.group, []).append(ep)
        return cls(lambda g: by_group[g], len(by_group), group_ids=sorted(by_group))

    def launch(self) -> list[Episode]:
        """Episodes to start now: the initial launch first, then top-ups (dynamic sampling)."""
        if self.sampler is None:
            if self._episodes:
                return []
            ids = self._ids
        else:
            start = max(self._episodes, default=-1) + 1
            ids = range(start, start + self.sampler.to_launch())
        new: list[Episode] = []
        for g in ids:
            eps = self.make_group(g)
            if len(eps) < 2 and self.sampler is not None:
                raise ValueError(f"group {g} has {len(eps)} trajectories; variance needs >= 2")
            self._episodes[g], self._done[g] = eps, 0
            if self.sampler is not None:
                self.sampler.on_group_launched(g)
            new.extend(eps)
        return new

    def on_trajectory_done(self, ep: Episode) -> list[str]:
        """Record a finished trajectory; return trajectory ids that became surplus (to abort)."""
        g = ep.group
        self._done[g] += 1
        if self._done[g] < len(self._episodes[g]):
            return []
        self._finished_order.append(g)
        if self.sampler is None:
            return []
        self.sampler.on_group_done(g, [e.rows[-1]["trajectory_reward"] for e in self._episodes[g]])
        surplus = []
        for s in self.sampler.surplus_to_abort():
            self.sampler.on_group_aborted(s)
            self._aborted.add(s)
            surplus += [e.trajectory_id for e in self._episodes[s] if not e.done]
        return surplus

    def kept_groups(self) -> list[int]:
        if self.sampler is None:
            return list(self._episodes)
        kept = self.sampler.batch()
        fill = [g for g in self._finished_order if g not in kept][: self.groups - len(kept)]
        return kept + fill

    def kept(self) -> list[Episode]:
        """Episodes that go to the Arrow step, group by group."""
        return [ep for g in self.kept_groups() for ep in self._episodes[g]]

    def summary(self) -> dict:
        out = {"groups_launched": len(self._episodes), "groups_kept": len(self.kept_groups()),
               "groups_aborted": len(self._aborted)}
        if self.sampler is not None:
            s = self.sampler.summary()
            out.update(groups_varied=s["kept"], groups_zero_variance=s["dropped"],
                       keep_rate=s["keep_rate"], next_step_launch=s["next_step_launch"])
        return out
