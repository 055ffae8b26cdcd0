"""What a step launches, and when its rollout ends: GRPO's fixed batch, or DAPO's redundant
sampling (paper §2, §6.1). A mixin of ClusterSim (sim/cluster.py).

GRPO: the step launches its batch and its rollout ends with the last trajectory.
DAPO: "the rollout stage continues until it collects the target number of trajectory groups with
non-zero reward variance", and "we adjust the maximum number of concurrent trajectories at each
step based on the previous step" (ROSE paper §6.1), so the trajectories launched vary per step,
"with the maximum reaching the user specified batch size" (§2, Fig. 1d). Here a step wants
batch / group_size valid groups and launches ceil(wanted / v) groups, v the valid share of the
groups the previous step finished (the configured `dapo_valid_rate` at step 1), with at most
twice the batch out at once; a group is valid with probability `dapo_valid_rate` (chosen: the paper gives
no share) when its last trajectory ends. When every launched group is done and too few were
valid, the deficit is launched the same way. When enough are valid the rollout ends and the
trajectories still out are dropped: their tokens were computed, so they count in the step's
tokens, not in its valid groups.
"""
from __future__ import annotations

import math


class RedundantSampling:
    _valid_share: float | None = None  # valid / finished groups of the last DAPO step that ended

    def _launch_step(self, step: int) -> None:
        cfg = self.cfg
        batch = cfg.traj_per_rollout_gpu * cfg.rollout_gpus
        self._index, self._groups = 0, {}
        self._valid = self._groups_done = self._groups_out = 0
        if cfg.algorithm == "grpo":
            self._left = batch
            self._launch(step, batch, None)
            return
        self._wanted = max(1, batch // cfg.group_size)
        self._launch_groups(step, self._wanted)

    def _launch_groups(self, step: int, wanted: int) -> None:
        cfg = self.cfg
        share = self._valid_share or cfg.dapo_valid_rate
        out = self._groups_out * cfg.group_size  # at most twice the batch out at once
        n = min(math.ceil(wanted / max(share, 1e-3)), (2 * self._wanted * cfg.group_size - out) // cfg.group_size)
        for _ in range(max(1, n)):
            gid = len(self._groups)
            self._groups[gid] = 0
            self._groups_out += 1
            self._launch(step, cfg.group_size, gid)

    def _launch(self, step: int, n: int, group: int | None) -> None:
        for traj in self._draw_batch(n):  # sim/tail_batching.py (the plain draw unless configured)
            tid = f"s{step}-t{self._index}"
            self._index += 1
            self.trajs[tid] = [traj, 0, traj.first_prompt, group]
            self.counts["started"] += 1
            self.queue.append(tid)

    def _rollout_done_with(self, tid: str, group: int | None) -> bool:
        """A trajectory ended; whether the step's rollout is now over."""
        if self.cfg.algorithm == "grpo":
            self._left -= 1
            return self._left == 0
        cfg = self.cfg
        self._groups[group] += 1
        if self._groups[group] < cfg.group_size:
            return False
        self._groups_out -= 1
        self._groups_done += 1
        self._valid += self.rng.random() < cfg.dapo_valid_rate
        if self._valid >= self._wanted:
            self._valid_share = self._valid / self._groups_done
            self._drop_the_rest()
            return True
        if self._groups_out == 0:  # every launched group is done, too few valid: launch more
            self._valid_share = self._valid / self._groups_done
            self._launch_groups(self._step, self._wanted - self._valid)
            self._dispatch()
        return False

    def _drop_the_rest(self) -> None:
        """Trajectories still out once enough groups are valid: out of the queue, taken back from
        their devices (ClusterSim._abort forgets a dropped one instead of rerouting it), and those
        between turns forgotten when their environment answers (_ready)."""
        rest = list(self.trajs)
        self._dropped.update(rest)
        self.queue.clear()
        for tid in rest:
            sent = self._sent.get(tid)
            if sent is not None:
                self.devices[sent[0]].take_back(tid)
            else:
                self._forget_dropped(tid)
        self.counts["dropped"] += len(rest)

    def _forget_dropped(self, tid: str) -> None:
        if tid in self.trajs:
            self.router.forget(tid)
            del self.trajs[tid]
