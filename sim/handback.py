"""The simulator's side of the tail hand-back (executors/policies/tail_handback.py): the same
policy object the rollout scheduler uses, fed from the simulator's own bookkeeping. A mixin of
ClusterSim (sim/cluster.py), which keeps `_borrowed` (turns out on co-serving GPUs, oldest
first), `_dedicated_out` and `_sent` as it places, finishes and aborts turns."""
from __future__ import annotations

import math


class HandbackSide:
    def _turn_out(self, tid: str, name: str, k: int) -> None:
        """Turn k of `tid` sent to device `name` now."""
        self._sent[tid] = (name, self.loop.now)
        if name in self.flags:  # a co-serving GPU; appended, so the dict stays oldest first
            self._borrowed.pop(tid, None)
            self._borrowed[tid] = (self.loop.now, (tid, k))
        elif not self.devices[name].borrowed:
            self._dedicated_out += 1

    def _turn_left(self, dev, tid: str) -> float | None:
        """The turn left `dev` (finished or aborted); when it was sent, if dev is a dedicated GPU."""
        _, sent = self._sent.pop(tid)
        self._borrowed.pop(tid, None)
        if dev.kind == "rollout" and not dev.borrowed:
            self._dedicated_out -= 1
            return sent
        return None

    def _hand_back_tail(self, _=None) -> None:
        """Borrowed turns out too long while dedicated GPUs have room come home (the scheduler's
        own policy, executors/policies/tail_handback.py). Called on every finished turn, so the
        common cases return in O(1): something queued, no room, or the oldest not yet due."""
        now = self.loop.now
        if now >= self._handback_at:
            self._handback_at = math.inf
        # pinned trajectories never move: a handed-back turn would only wait for its home again
        if not (self.cfg.tail_handback and self._borrowed) or self.queue or self.cfg.mode == "pinned":
            return
        free = self.cfg.rollout_gpus * self.cfg.cap_per_rollout_gpu - self._dedicated_out
        limit = self.handback.threshold_s()
        if free <= 0 or limit is None:
            return
        oldest = next(iter(self._borrowed.values()))[0]
        if now < oldest + limit:  # nothing due yet: look again when the oldest will be
            if oldest + limit < self._handback_at:
                self._handback_at = oldest + limit
                self.loop.at(oldest + limit, self._hand_back_tail)
            return
        # what the policy can choose: the oldest-first turns out for `limit` or longer, up to the
        # `free` oldest not handed back yet (and any sent at the same time as the last of those)
        out_long, fresh, last = {}, 0, None
        for sent, key in self._borrowed.values():
            if now - sent < limit or (fresh >= free and sent != last):
                break
            out_long[key] = sent
            if not self.handback.handed_back(key):
                fresh, last = fresh + 1, sent
        for tid, _k in self.handback.due(out_long, free, 0, now):
            self.counts["handed_back"] += 1
            self.devices[self._sent[tid][0]].take_back(tid)  # aborts it there: _abort reroutes it
