"""Turn-wise routing policy of the elastic rollout scheduler (paper 4.3).

Every TURN is routed afresh (not every trajectory), in this order:
  1. the cache-affine worker, the one that served the trajectory's previous turn and so holds its
     prefix KV, if it has room: a dedicated rollout worker below its cap running at most
     `affinity_max_excess` turns more than the least-loaded dedicated one, or a serving worker
     whose admission (the co-serving executor's current decision) accepts while no dedicated
     worker has room. A prefix hit saves one prefill of the context; the cost of keeping it is
     paid on every decode step after: a busier worker decodes each of its turns slower, and a
     borrowed serving GPU runs rollout only in serving's slack. On the paper's 8B workload in the
     simulator, affinity without these bounds kept 17% of tokens on serving GPUs (9.5% without
     affinity) and lost 5% of throughput over 5 seeds; with them it is level with turn-wise
     routing (sim/paper_figures.py, Table 3);
  2. else the least-loaded dedicated rollout worker below its cap, of the device class the
     trajectory's environment tag prefers (hw_affinity.py) while one of that class has room, else
     of any class;
  3. else the least-loaded serving worker whose admission accepts;
  4. else None: the caller queues the turn and asks again when a turn ends.
Plain Python, no engine, no network: the rollout proxy reports turn starts, ends, aborts and dead
workers, and may push each co-serving executor's admission changes (`set_admitting`).

Cost of a decision: O(1) for steps 1-2; step 3 walks the serving workers not marked closed, in
load order, and calls `admits` once per declining one. A closed worker drains to load 0 and would
head that walk, so pushing admission changes keeps step 3 at ~1 call; without pushes it is
O(serving workers) when most decline. Bookkeeping per turn start/end: O(log D), D = distinct loads
among workers of one kind (at most cap + 1 for rollout workers).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from executors.policies.hw_affinity import STANDARD_CLASS, HwAffinity
from executors.policies.load_index import LoadIndex
from core.modes import ROUTING_MODES, RoutingMode

# turns the cache-affine dedicated worker may run beyond the least-loaded one and keep a
# trajectory: 0-2 were level with turn-wise routing on the simulated 8B workload, unbounded lost 3%
AFFINITY_MAX_EXCESS = 2
Kind = Literal["rollout", "serving"]
KINDS: tuple[str, ...] = ("rollout", "serving")
Admits = Callable[[str], bool]


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    kind: Kind
    device_class: str = STANDARD_CLASS  # e.g. "compute" or "bandwidth" (hw_affinity.py)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("worker name must be non-empty")
        if not self.device_class:
            raise ValueError(f"worker {self.name!r}: device_class must be non-empty")
        if self.kind not in KINDS:
            raise ValueError(f"worker {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")


class Placement(NamedTuple):
    """Where one turn ran: a row of the trajectory's placement record (Arrow dataset).

    A tuple of plain values: the garbage collector stops tracking it, so thousands of live
    trajectories' records do not lengthen collection pauses.
    """

    turn: int  # index of the turn in its trajectory; a rerouted turn repeats the aborted one's
    worker: str
    kind: Kind
    rerouted: bool  # placed again after its worker died, stalled or aborted it
    affine: bool  # on the worker that served the previous turn (its prefix KV is likely there)


class StaleTurnError(ValueError):
    """A report about a turn the router no longer holds (e.g. a late result from a dead worker)."""


@dataclass(slots=True)
class _Worker:
    info: WorkerInfo
    epoch: int  # a re-registered name is a new incarnation with an empty prefix cache
    indexed: bool = True  # False for a serving worker whose executor said it admits nothing
    in_flight: dict[str, None] = field(default_factory=dict)  # trajectory ids, in start order


@dataclass(slots=True)  # no per-object __dict__: fewer objects for the GC to walk
class _Trajectory:
    last: tuple[str, int] | None = None  # (worker, epoch) that served the previous turn
    home: tuple[str, int] | None = None  # first worker, for mode="pinned"
    running: str | None = None  # worker running its current turn
    turns_done: int = 0
    reroute: bool = False  # its last turn was lost; the next placement is a reroute
    placements: list[Placement] = field(default_factory=list)


def _never(_: str) -> bool:
    return False


class TurnRouter:
    """Routing state for one rollout: worker loads, cache affinity, per-trajectory placements."""

    def __init__(self, cap_per_rollout_worker: int = 16, mode: RoutingMode = "turnwise_affinity",
                 affinity: HwAffinity | None = None, affinity_max_excess: int = AFFINITY_MAX_EXCESS) -> None:
        if cap_per_rollout_worker < 1:
            raise ValueError(f"cap_per_rollout_worker must be >= 1, got {cap_per_rollout_worker}")
        if affinity_max_excess < 0:
            raise ValueError(f"affinity_max_excess must be >= 0, got {affinity_max_excess}")
        self.affinity_max_excess = affinity_max_excess
        if mode not in ROUTING_MODES:
            raise ValueError(f"mode must be one of {ROUTING_MODES}, got {mode!r}")
        self.cap = cap_per_rollout_worker
        self.mode = mode
        self._workers: dict[str, _Worker] = {}
        self._index = {"rollout": LoadIndex(), "serving": LoadIndex()}
        self.affinity = affinity or HwAffinity()
        # rollout workers by device class, kept only when some class is preferred (no cost otherwise)
        self._class_index: dict[str, LoadIndex] | None = {} if self.affinity.classes else None
        self._trajs: dict[str, _Trajectory] = {}
        self._epochs = itertools.count()

    # -- workers ---------------------------------------------------------------------------------
    def register_worker(self, info: WorkerInfo) -> None:
        if info.name in self._workers:
            raise ValueError(f"worker {info.name!r} is already registered")
        self._workers[info.name] = _Worker(info, next(self._epochs))
        self._index[info.kind].add(info.name, 0)
        if info.kind == "rollout" and self._class_index is not None:
            self._class_index.setdefault(info.device_class, LoadIndex()).add(info.name, 0)

    def remove_worker(self, name: str) -> list[str]:
        """Drop a dead or withdrawn worker; return the trajectories whose turn it was running.

        Those turns are lost with the worker: the caller reroutes them (re-prefill elsewhere from
        the trajectory's history). Affinity and pins to the worker lapse, since its KV is gone.
        """
        worker = self._workers.pop(name, None)
        if worker is None:
            raise KeyError(f"unknown worker {name!r}")
        if worker.indexed:
            self._index[worker.info.kind].discard(name, len(worker.in_flight))
        if worker.info.kind == "rollout" and self._class_index is not None:
            self._class_index[worker.info.device_class].discard(name, len(worker.in_flight))
        lost = list(worker.in_flight)
        for tid in lost:
            traj = self._trajs[tid]
            traj.running, traj.reroute = None, True
        return lost

    def set_admitting(self, name: str, admitting: bool) -> None:
        """A co-serving executor's admission changed. While closed, a serving worker is skipped by
        the least-loaded walk without asking `admits`; when open, `admits` still has the last word.
        """
        worker = self._worker(name)
        if worker.info.kind != "serving":
            raise ValueError(f"worker {name!r} is a {worker.info.kind} worker; only serving workers admit")
        if worker.indexed == admitting:
            return
        worker.indexed = admitting
        index = self._index["serving"]
        (index.add if admitting else index.discard)(name, len(worker.in_flight))

    def workers(self) -> list[WorkerInfo]:
        return [w.info for w in self._workers.values()]

    def load(self, name: str) -> int:
        """Turns in flight on a worker."""
        return len(self._worker(name).in_flight)

    # -- the decision ----------------------------------------------------------------------------
    def route(self, trajectory_id: str, admits: Admits | None = None, tag: str | None = None) -> str | None:
        """Pick the worker for this trajectory's next turn, or None (queue it).

        `admits(name)` is a serving worker's current admission decision; None means no serving
        worker admits anything (serving first: only the co-serving executor can say yes).
        `tag`: the trajectory's environment, whose preferred device class goes first.
        Pure: nothing changes until the caller reports `on_turn_start`.
        """
        accepts = admits or _never
        traj = self._trajs.get(trajectory_id)
        if traj is not None:
            if traj.running is not None:
                raise ValueError(f"trajectory {trajectory_id!r} already has a turn on {traj.running!r}")
            if self.mode == "pinned":
                home = self._live(traj.home)
                if home is not None:  # a pinned trajectory waits for its home worker
                    return home.info.name if self._has_room(home, accepts) else None
            elif self.mode == "turnwise_affinity":
                affine = self._live(traj.last)
                if affine is not None and self._keeps_affinity(affine, accepts):
                    return affine.info.name
        return self._least_loaded(accepts, tag)

    def _least_loaded(self, accepts: Admits, tag: str | None = None) -> str | None:
        if self._class_index is not None:
            preferred = self._class_index.get(self.affinity.preferred(tag))
            least = preferred.least() if preferred is not None else None
            if least is not None and least[1] < self.cap:
                return least[0]
        least = self._index["rollout"].least()  # the preferred class is saturated: any class
        if least is not None and least[1] < self.cap:
            return least[0]
        for name in self._index["serving"].ascending():
            if accepts(name):
                return name
        return None

    def _keeps_affinity(self, affine: _Worker, accepts: Admits) -> bool:
        """Step 1's bounds: the affine worker has room and its prefix hit is worth its load."""
        if not self._has_room(affine, accepts):
            return False
        least = self._index["rollout"].least()
        if affine.info.kind == "serving":  # borrowed: only while dedicated capacity is full
            return least is None or least[1] >= self.cap
        return least is None or len(affine.in_flight) <= least[1] + self.affinity_max_excess

    def _has_room(self, worker: _Worker, accepts: Admits) -> bool:
        if worker.info.kind == "rollout":
            return len(worker.in_flight) < self.cap
        return worker.indexed and accepts(worker.info.name)

    def _live(self, ref: tuple[str, int] | None) -> _Worker | None:
        if ref is None:
            return None
        worker = self._workers.get(ref[0])
        return worker if worker is not None and worker.epoch == ref[1] else None

    # -- turn reports ----------------------------------------------------------------------------
    def on_turn_start(self, trajectory_id: str, worker: str) -> Placement:
        w = self._worker(worker)
        traj = self._trajs.get(trajectory_id)
        if traj is None:
            traj = self._trajs[trajectory_id] = _Trajectory()
        elif traj.running is not None:
            raise ValueError(f"trajectory {trajectory_id!r} already has a turn on {traj.running!r}")
        ref = (worker, w.epoch)
        placement = Placement(traj.turns_done, worker, w.info.kind, traj.reroute, traj.last == ref)
        traj.placements.append(placement)
        traj.running, traj.reroute = worker, False
        if self._live(traj.home) is None:
            traj.home = ref
        self._shift(w, trajectory_id, +1)
        return placement

    def on_turn_end(self, trajectory_id: str, worker: str) -> None:
        traj = self._running_on(trajectory_id, worker)
        w = self._workers[worker]
        self._shift(w, trajectory_id, -1)
        traj.running, traj.last = None, (worker, w.epoch)
        traj.turns_done += 1

    def on_turn_aborted(self, trajectory_id: str, worker: str) -> None:
        """The worker gave the turn back (emergency KV cut, stall): reroute it, affinity lapses."""
        traj = self._running_on(trajectory_id, worker)
        self._shift(self._workers[worker], trajectory_id, -1)
        traj.running, traj.reroute = None, True
        if traj.last is not None and traj.last[0] == worker:
            traj.last = None  # the aborted request's KV was freed

    def forget(self, trajectory_id: str) -> list[Placement]:
        """Trajectory over (finished or aborted as surplus): free its slot, return its placements."""
        traj = self._trajs.pop(trajectory_id, None)
        if traj is None:
            raise KeyError(f"unknown trajectory {trajectory_id!r}")
        if traj.running is not None:
            self._shift(self._workers[traj.running], trajectory_id, -1)
        return traj.placements

    def placements(self, trajectory_id: str) -> list[Placement]:
        traj = self._trajs.get(trajectory_id)
        if traj is None:
            raise KeyError(f"unknown trajectory {trajectory_id!r}")
        return list(traj.placements)

    def _shift(self, w: _Worker, trajectory_id: str, delta: int) -> None:
        load = len(w.in_flight)
        if delta > 0:
            w.in_flight[trajectory_id] = None
        else:
            del w.in_flight[trajectory_id]
        if w.indexed:
            index = self._index[w.info.kind]
            index.discard(w.info.name, load)
            index.add(w.info.name, load + delta)
        if w.info.kind == "rollout" and self._class_index is not None:
            index = self._class_index[w.info.device_class]
            index.discard(w.info.name, load)
            index.add(w.info.name, load + delta)

    def _running_on(self, trajectory_id: str, worker: str) -> _Trajectory:
        traj = self._trajs.get(trajectory_id)
        if traj is None or traj.running != worker or worker not in self._workers:
            raise StaleTurnError(f"trajectory {trajectory_id!r} has no turn in flight on {worker!r}")
        return traj

    def _worker(self, name: str) -> _Worker:
        worker = self._workers.get(name)
        if worker is None:
            raise KeyError(f"unknown worker {name!r}")
        return worker
