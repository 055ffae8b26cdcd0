"""Serving-first KV memory: a rollout block budget that yields to serving bursts.

The paper's memory policy (4.1), enforced in KV blocks (on GPU the same policy drives
VMM pages). Blocks are one pool of `total_blocks`; `reserve` = ceil(reserve_fraction * total)
is serving's headroom.
- start_step: budget = total - reserve - serving's recent peak (>= 0); state NORMAL.
- Burst trigger: serving usage at/over the watermark = (total - budget) - reserve
  + high_watermark * reserve, i.e. serving has eaten `high_watermark` of its headroom.
- Emergency cut (PRESSURE): budget //= cut_factor at once; rollout KV is freed until it fits:
  leased prefix-cache blocks first (soonest lease end first: no work is lost), then whole
  running requests, largest first (fewest trajectories disturbed), ties to the youngest
  (least progress lost). Aborted requests are reported reroutable.
- FROZEN once every aborted request is freed: the budget never grows until the next
  start_step. Serving crossing the (higher) watermark again once the aborts are done cuts
  again: serving comes first.
Nothing reads a clock: callers pass `now`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Hashable, Literal

RequestId = Hashable
TrajectoryId = Hashable


class MemoryState(str, Enum):
    NORMAL = "normal"
    PRESSURE = "pressure"  # cut issued, waiting for the aborted requests' KV to be freed
    FROZEN = "frozen"  # cut done; no budget growth until the next RL step


@dataclass(frozen=True)
class Action:
    """What the executor must do after a policy decision."""

    kind: Literal["abort", "drop_prefix"]
    trajectory_id: TrajectoryId
    blocks: int
    request_id: RequestId | None = None  # set for "abort"
    reroutable: bool = False  # an aborted turn goes back to the scheduler to be rerouted


@dataclass(frozen=True)
class Lease:
    trajectory_id: TrajectoryId
    blocks: int
    expires_at: float


@dataclass
class _Request:
    trajectory_id: TrajectoryId
    blocks: int
    admitted_at: float


class KVMemoryPolicy:
    def __init__(self, total_blocks: int, reserve_fraction: float = 0.2,
                 high_watermark: float = 0.5, cut_factor: int = 2, lease_s: float = 10.0) -> None:
        if total_blocks < 1:
            raise ValueError(f"total_blocks must be >= 1, got {total_blocks}")
        if not 0 < reserve_fraction < 1:
            raise ValueError(f"reserve_fraction must be in (0, 1), got {reserve_fraction}")
        if not 0 <= high_watermark <= 1:
            raise ValueError(
                f"high_watermark (share of the reserve) must be in [0, 1], got {high_watermark}")
        if cut_factor < 2:
            raise ValueError(f"cut_factor must be >= 2, got {cut_factor}")
        if not (math.isfinite(lease_s) and lease_s > 0):
            raise ValueError(f"lease_s must be positive, got {lease_s}")
        self.total_blocks, self.cut_factor, self.lease_s = total_blocks, cut_factor, lease_s
        self.high_watermark = high_watermark
        self.reserve_blocks = math.ceil(reserve_fraction * total_blocks)
        self.state = MemoryState.NORMAL
        self.budget = 0  # no rollout KV until the first start_step sets a budget
        self.serving_used = 0
        self.cuts = 0
        self.aborted_total = 0
        self.last_cut_at: float | None = None
        self._requests: dict[RequestId, _Request] = {}
        self._leases: dict[TrajectoryId, Lease] = {}
        self._aborting: set[RequestId] = set()
        # running totals and the earliest lease end: asked every engine step, so kept O(1)
        self._request_blocks = self._prefix_blocks = 0
        self._next_expiry = math.inf

    # ---- accounting -------------------------------------------------------------------
    @property
    def request_blocks(self) -> int:
        return self._request_blocks

    @property
    def prefix_blocks(self) -> int:
        return self._prefix_blocks

    def _put_lease(self, lease: Lease) -> None:
        self._leases[lease.trajectory_id] = lease
        self._prefix_blocks += lease.blocks
        self._next_expiry = min(self._next_expiry, lease.expires_at)

    def _pop_lease(self, trajectory_id: TrajectoryId) -> Lease | None:
        lease = self._leases.pop(trajectory_id, None)
        if lease is not None:
            self._prefix_blocks -= lease.blocks
        return lease

    @property
    def rollout_used(self) -> int:
        return self.request_blocks + self.prefix_blocks

    @property
    def serving_headroom(self) -> int:
        """Free blocks serving can still take right now."""
        return self.total_blocks - self.serving_used - self.rollout_used

    @property
    def watermark_blocks(self) -> float:
        """Serving usage (blocks) that fires the burst trigger."""
        return (self.total_blocks - self.budget - self.reserve_blocks
                + self.high_watermark * self.reserve_blocks)

    # ---- RL-step budget ------------------------------------------------------------------
    def start_step(self, serving_recent_peak_blocks: int, now: float) -> int:
        """Set the rollout budget for a new RL step from serving's recent peak; unfreezes.

        Rollout KV already above the new budget is not aborted here: can_allocate refuses until
        it drains (leases expire, requests finish). Aborts still in flight stay pending (never
        picked twice). Returns the new budget.
        """
        if not 0 <= serving_recent_peak_blocks <= self.total_blocks:
            raise ValueError(
                f"serving peak {serving_recent_peak_blocks} outside 0..{self.total_blocks} blocks")
        self.budget = max(0, self.total_blocks - self.reserve_blocks - serving_recent_peak_blocks)
        self.state = MemoryState.NORMAL
        return self.budget

    def observe_serving(self, used_blocks: int, now: float) -> list[Action]:
        """Record serving KV usage; on a burst, cut the rollout budget and say what to free."""
        if not 0 <= used_blocks <= self.total_blocks:
            raise ValueError(
                f"serving usage {used_blocks} outside 0..{self.total_blocks} blocks")
        self.serving_used = used_blocks
        if (used_blocks < self.watermark_blocks
                or self.state is MemoryState.PRESSURE  # the last cut's aborts are still in flight
                or (self.budget == 0 and self.rollout_used == 0)):  # nothing left to cut
            return []
        return self._emergency_cut(now)

    def yield_to_serving(self, blocks_needed: int, now: float) -> list[Action]:
        """A serving user is at the door and rollout holds the device: cut now (as a burst
        would) when serving's free blocks less its reserve cannot hold `blocks_needed`; no
        action where they can (compute, not memory, is what the user needs then)."""
        if blocks_needed < 0:
            raise ValueError(f"blocks needed must be >= 0, got {blocks_needed}")
        if (self.state is MemoryState.PRESSURE or self.rollout_used == 0
                or self.serving_headroom - self.reserve_blocks >= blocks_needed):
            return []
        return self._emergency_cut(now)

    def _emergency_cut(self, now: float) -> list[Action]:
        self.budget //= self.cut_factor
        self.cuts += 1
        self.last_cut_at = now
        actions: list[Action] = []
        excess = self.rollout_used - self.budget
        for lease in sorted(self._leases.values(), key=lambda lease: lease.expires_at):
            if excess <= 0:
                break
            self._pop_lease(lease.trajectory_id)
            excess -= lease.blocks
            actions.append(Action("drop_prefix", lease.trajectory_id, lease.blocks))
        live = [(rid, r) for rid, r in self._requests.items() if rid not in self._aborting]
        for rid, r in sorted(live, key=lambda kv: (-kv[1].blocks, -kv[1].admitted_at)):
            if excess <= 0:
                break
            self._aborting.add(rid)
            excess -= r.blocks
            self.aborted_total += 1
            actions.append(Action("abort", r.trajectory_id, r.blocks, rid, reroutable=True))
        self.state = MemoryState.PRESSURE if self._aborting else MemoryState.FROZEN
        return actions

    # ---- rollout allocation ----------------------------------------------------------------
    def can_allocate(self, rollout_blocks_needed: int) -> bool:
        """True iff rollout may take this many more blocks: within budget, headroom kept."""
        if rollout_blocks_needed < 0:
            raise ValueError(f"blocks needed must be >= 0, got {rollout_blocks_needed}")
        if self.state is MemoryState.PRESSURE:
            return False
        after = self.rollout_used + rollout_blocks_needed
        return (after <= self.budget
                and self.total_blocks - self.serving_used - after >= self.reserve_blocks)

    def on_rollout_alloc(self, request_id: RequestId, blocks: int, now: float,
                         trajectory_id: TrajectoryId | None = None) -> None:
        """Record `blocks` more KV blocks held by a running rollout request (ask can_allocate first)."""
        if blocks < 0:
            raise ValueError(f"allocated blocks must be >= 0, got {blocks}")
        r = self._requests.get(request_id)
        if r is None:
            tid = request_id if trajectory_id is None else trajectory_id
            self._requests[request_id] = _Request(tid, blocks, now)
        else:
            r.blocks += blocks
        self._request_blocks += blocks

    def on_rollout_free(self, request_id: RequestId) -> int:
        """The request finished or was aborted and its blocks are free. Returns the blocks freed
        (0 for an unknown id: an abort and a finish can race, so freeing twice is harmless)."""
        r = self._requests.pop(request_id, None)
        if r is not None:
            self._request_blocks -= r.blocks
        self._aborting.discard(request_id)
        if self.state is MemoryState.PRESSURE and not self._aborting:
            self.state = MemoryState.FROZEN
        return 0 if r is None else r.blocks

    # ---- prefix-cache leases ----------------------------------------------------------------
    def touch_prefix(self, trajectory_id: TrajectoryId, blocks: int, now: float) -> bool:
        """Keep (or renew) a trajectory's cached prefix of `blocks` blocks for lease_s from now.

        Returns False when the blocks do not fit the budget or headroom: the executor drops them.
        """
        if blocks < 0:
            raise ValueError(f"prefix blocks must be >= 0, got {blocks}")
        self._pop_lease(trajectory_id)  # a renewal re-checks its blocks like a new lease
        if blocks == 0:
            return True
        if not self.can_allocate(blocks):
            return False
        self._put_lease(Lease(trajectory_id, blocks, now + self.lease_s))
        return True

    def drop_prefix(self, trajectory_id: TrajectoryId) -> int:
        lease = self._pop_lease(trajectory_id)
        return 0 if lease is None else lease.blocks

    @property
    def next_lease_end(self) -> float:
        """No lease ends before this time (it may be earlier than the first that does)."""
        return self._next_expiry

    def expired_leases(self, now: float) -> list[Lease]:
        """Leases ended at or before `now`; they are removed here, the executor frees the blocks."""
        if now < self._next_expiry:  # the common case: nothing ends yet
            return []
        gone = sorted((lease for lease in self._leases.values() if lease.expires_at <= now),
                      key=lambda lease: lease.expires_at)
        for lease in gone:
            self._pop_lease(lease.trajectory_id)
        self._next_expiry = min((lease.expires_at for lease in self._leases.values()),
                                default=math.inf)
        return gone

    def snapshot(self) -> dict:
        return {
            "state": self.state.value, "total_blocks": self.total_blocks,
            "reserve_blocks": self.reserve_blocks, "budget_blocks": self.budget,
            "serving_used_blocks": self.serving_used, "rollout_used_blocks": self.rollout_used,
            "rollout_request_blocks": self.request_blocks, "rollout_prefix_blocks": self.prefix_blocks,
            "serving_headroom_blocks": self.serving_headroom, "watermark_blocks": self.watermark_blocks,
            "rollout_requests": len(self._requests), "aborting": len(self._aborting),
            "leases": len(self._leases), "cuts": self.cuts, "aborted_total": self.aborted_total,
            "last_cut_at": self.last_cut_at,
        }
