"""RollPacker's tail batching (Gao et al., "RollPacker: Mitigating Long-Tail Rollouts for Fast,
Synchronous RL Post-Training"): prompts that lead to long-tail responses are taken out of the
ordinary (short) rounds and consolidated into a few designated long rounds, so short rounds
wait for no long tail. A mixin of ClusterSim (sim/cluster.py), drawing GRPO's batch.

Modelled with an oracle: a trajectory whose response tokens fall in the top `tail_share` of
the workload's is deferred before it starts (RollPacker finds them by letting responses run and
cutting those that run long, work this model does not charge), and a step whose deferred pool
holds a batch is a long round of them. With tail_share 0.25, every fourth round is long.
"""
from __future__ import annotations

import random

from sim.workload import Trajectory

THRESHOLD_SAMPLE = 4000  # trajectories drawn (with their own seed) to place the tail's threshold


class TailBatching:
    _threshold: float | None = None  # response tokens above which a trajectory is long (set once)

    def _tail_threshold(self) -> float:
        if self._threshold is None:
            rng = random.Random(f"tail-{self.cfg.seed}")
            sizes = sorted(sum(self.workload.sample(rng).responses) for _ in range(THRESHOLD_SAMPLE))
            self._threshold = sizes[int((1 - self.cfg.tail_share) * len(sizes))]
            self._deferred: list[Trajectory] = []
            self.counts.setdefault("long_rounds", 0)
        return self._threshold

    def _draw_batch(self, n: int) -> list[Trajectory]:
        """The step's trajectories: a long round of the deferred ones when a batch has gathered,
        else n short ones (long draws deferred)."""
        if not self.cfg.tail_batching:
            return [self.workload.sample(self.rng) for _ in range(n)]
        limit = self._tail_threshold()
        if len(self._deferred) >= n:
            batch, self._deferred = self._deferred[:n], self._deferred[n:]
            self.counts["long_rounds"] += 1
            return batch
        out = []
        while len(out) < n:
            t = self.workload.sample(self.rng)
            (out if sum(t.responses) <= limit else self._deferred).append(t)
        return out
