"""Co-execution groups (RollMux): runs that share one rollout pool and one trainer pool, one
run's rollout filling another's training phase, each run kept within its SLO factor.

API (stable; the product's `rose train --group` and the simulator call these):

    RunProfile(run, rollout_s, train_s, rollout_parked_bytes=0, train_parked_bytes=0, slo_factor=2.0,
               rollout_pool=ROLLOUT)
        a run's measured solo phase times (seconds per step) and the host memory its parked state
        takes on each pool; T_solo = rollout_s + train_s (its own pools, nothing shared).
        `rollout_pool`: which of the group's rollout pools it rolls out on; one ("rollout") unless
        the group's rollout side is scaled out (RollMux's rollout scaling: "rollout/<name>" pools,
        each with its own round robin, one trainer pool for all).
    PoolLimits(rollout_host_bytes, train_host_bytes, switch_s=0.0, max_runs=None)
        host memory on each pool for the group's parked states; `switch_s` a warm start's cost
        each time a pool passes from one run to another; `max_runs` an optional cap.
    CoexecGroup(name, runs=())                 .with_run(p) .without(run) .names .step_times(limits)
    co_step_times(runs, switch_s=0.0) -> {run: T_co}    (the round robin's steady state)
    play_round_robin(runs, switch_s=0.0, rounds=20) -> {run: [step end times]}   (the same, played)
    check_admission(group, run, limits) -> Admission(run, group, admitted, reason, step_times)
    fits(group, run, limits) -> str            room alone (size cap, host memory): why not, or ""
    join_group(groups, name, run, limits) -> Placement(run, group, new_group, reason, step_times)
        into the group `name` if admitted, else a new group of its own named after the run,
        with the reason; raises CoexecGroupError when the run cannot fit even alone.
    PhaseTurns(order=(), served={})            .join(run) .leave(run) .whose_turn(pool)
        .next(pool, waiting) .served_by(pool, run) .to_dict() / PhaseTurns.from_dict(d)
    ROLLOUT, TRAIN: the pool names (PhaseTurns takes these two).

Admission checks (a) residency: the parked states of all the group's runs fit each pool's host
memory, so every switch is a warm start from host memory; (b) the SLO rule: for every run in the
group, T_co <= slo_factor x T_solo, T_co the step time in the steady state of the group's
phase-level round robin (PhaseTurns, the very permit order the product runs) on the runs' measured
phase times: exact for fixed phase times, and no run's T_co grows when another leaves the group.

The round robin is strict, as RollMux's meta-iteration: on each pool the turn is the member's
with the fewest phases served there (ties: group order), and the pool waits for it rather than
serve another run out of turn, so in each round every run rolls out once and trains once and no
run can be starved or delayed by another's extra phases. It cannot deadlock while each run
alternates rollout, train: the rollout turn-holder waiting to train would have rolled out fewer
times than the train turn-holder waiting to roll out has trained, which its turn rules out.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace

ROLLOUT = "rollout"
TRAIN = "train"
POOLS = (ROLLOUT, TRAIN)


class CoexecGroupError(ValueError):
    """A run that no group can take (its parked state alone exceeds a pool's host memory)."""


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


@dataclass(frozen=True)
class RunProfile:
    run: str
    rollout_s: float  # one step's rollout phase, the run alone on its pools
    train_s: float  # one step's training phase (update and weight sync)
    rollout_parked_bytes: int = 0  # host memory its parked rollout state takes on the rollout pool
    train_parked_bytes: int = 0  # weights + optimizer state parked on the trainer pool's hosts
    slo_factor: float = 2.0  # T_co may be at most this times T_solo
    rollout_pool: str = ROLLOUT

    def __post_init__(self) -> None:
        if not self.run:
            raise ValueError("run profile needs a run name")
        if not (self.rollout_pool == ROLLOUT or self.rollout_pool.startswith(ROLLOUT + "/")):
            raise ValueError(f"run {self.run}: rollout_pool must be {ROLLOUT!r} or '{ROLLOUT}/<name>', "
                             f"got {self.rollout_pool!r}")
        if not (self.rollout_s > 0 and self.train_s > 0):
            raise ValueError(f"run {self.run}: phase times must be > 0 s, got rollout {self.rollout_s}, "
                             f"train {self.train_s}")
        if self.rollout_parked_bytes < 0 or self.train_parked_bytes < 0:
            raise ValueError(f"run {self.run}: parked bytes must be >= 0")
        if not self.slo_factor >= 1:
            raise ValueError(f"run {self.run}: slo_factor must be >= 1, got {self.slo_factor}")

    @property
    def solo_s(self) -> float:
        return self.rollout_s + self.train_s

    def uses(self, pool: str) -> bool:
        return pool in (TRAIN, self.rollout_pool)

    def phase_s(self, pool: str) -> float:
        return self.train_s if pool == TRAIN else self.rollout_s

    def parked_bytes(self, pool: str) -> int:
        return self.train_parked_bytes if pool == TRAIN else self.rollout_parked_bytes


@dataclass(frozen=True)
class PoolLimits:
    rollout_host_bytes: int  # host memory on the rollout pool for parked states
    train_host_bytes: int
    switch_s: float = 0.0  # a warm start when a pool passes to another run (RollMux: 0.8-5.9 s)
    max_runs: int | None = None

    def __post_init__(self) -> None:
        if self.rollout_host_bytes < 0 or self.train_host_bytes < 0:
            raise ValueError("pool host memory must be >= 0 bytes")
        if self.switch_s < 0:
            raise ValueError(f"switch_s must be >= 0, got {self.switch_s}")
        if self.max_runs is not None and self.max_runs < 1:
            raise ValueError(f"max_runs must be >= 1 or None, got {self.max_runs}")

    def host_bytes(self, pool: str) -> int:
        return self.train_host_bytes if pool == TRAIN else self.rollout_host_bytes


@dataclass(frozen=True)
class PhaseTurns:
    """Which run gets a pool next: strict phase-level round robin over the group (see the module
    docstring). Plain data, JSON round-trip, so runs' drivers in separate processes can share it."""

    order: tuple[str, ...] = ()
    served: dict[str, dict[str, int]] = field(default_factory=dict)  # pool -> run -> phases served

    def __post_init__(self) -> None:
        if len(set(self.order)) != len(self.order):
            raise ValueError(f"phase turns: a run listed twice in {list(self.order)}")
        if set(self.served) - set(POOLS):
            raise ValueError(f"phase turns: unknown pools {sorted(set(self.served) - set(POOLS))}")

    def count(self, pool: str, run: str) -> int:
        return self.served.get(pool, {}).get(run, 0)

    def join(self, run: str) -> "PhaseTurns":
        """A run joins at the back of the current round: its counts equal the most served run's,
        so the runs behind it in this round go first."""
        if run in self.order:
            return self
        top = max((self.count(ROLLOUT, r) for r in self.order), default=0)
        served = {pool: {**self.served.get(pool, {}), run: top} for pool in POOLS}
        return PhaseTurns((*self.order, run), served)

    def leave(self, run: str) -> "PhaseTurns":
        """A run that ended or died: the others no longer wait for its turns."""
        served = {pool: {r: n for r, n in counts.items() if r != run} for pool, counts in self.served.items()}
        return PhaseTurns(tuple(r for r in self.order if r != run), served)

    def whose_turn(self, pool: str) -> str | None:
        _check_pool(pool)
        if not self.order:
            return None
        return min(self.order, key=lambda r: (self.count(pool, r), self.order.index(r)))

    def next(self, pool: str, waiting: Collection[str]) -> str | None:
        """The run that may take `pool` now among those `waiting` for it; None: the pool waits for
        the run whose turn it is."""
        run = self.whose_turn(pool)
        return run if run is not None and run in waiting else None

    def served_by(self, pool: str, run: str) -> "PhaseTurns":
        """`run` took `pool` for one phase: the turn passes on."""
        _check_pool(pool)
        if run not in self.order:
            raise ValueError(f"phase turns: run {run} is not in the group ({', '.join(self.order) or 'empty'})")
        counts = {**self.served.get(pool, {}), run: self.count(pool, run) + 1}
        return replace(self, served={**self.served, pool: counts})

    def to_dict(self) -> dict:
        return {"order": list(self.order), "served": {p: dict(c) for p, c in self.served.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "PhaseTurns":
        return cls(tuple(data.get("order", ())), {p: dict(c) for p, c in data.get("served", {}).items()})


def _check_pool(pool: str) -> None:
    if pool not in POOLS:
        raise ValueError(f"unknown pool {pool!r}: one of {', '.join(POOLS)}")


def play_round_robin(runs: Sequence[RunProfile], switch_s: float = 0.0, rounds: int = 20) -> dict[str, list[float]]:
    """The group's round robin played on the phase times, every run starting at rollout: when each
    run's steps end (0.0 first), `rounds` steps each. PhaseTurns decides every pool's next run."""
    names = _distinct(runs)
    by_name = {p.run: p for p in runs}
    pools = _pools(runs)
    # a round robin per pool over the runs using it (PhaseTurns' ROLLOUT turns for each rollout pool)
    turns = {pool: PhaseTurns(tuple(r for r in names if by_name[r].uses(pool))) for pool in pools}
    free = dict.fromkeys(pools, 0.0)
    last: dict[str, str | None] = dict.fromkeys(pools)
    ready = dict.fromkeys(names, 0.0)  # when the run's previous phase ended
    wants = {r: by_name[r].rollout_pool for r in names}
    step_ends: dict[str, list[float]] = {r: [0.0] for r in names}
    while names and min(len(ends) for ends in step_ends.values()) <= rounds:
        moved = False
        for pool in pools:
            kind = TRAIN if pool == TRAIN else ROLLOUT
            run = turns[pool].next(kind, [r for r in names if wants[r] == pool])
            if run is None:
                continue
            start = max(free[pool], ready[run]) + (switch_s if last[pool] not in (None, run) else 0.0)
            end = start + by_name[run].phase_s(pool)
            free[pool], last[pool], ready[run] = end, run, end
            wants[run] = TRAIN if pool != TRAIN else by_name[run].rollout_pool
            turns[pool] = turns[pool].served_by(kind, run)
            if pool == TRAIN:
                step_ends[run].append(end)
            moved = True
        if not moved:  # unreachable while runs alternate phases (module docstring)
            raise RuntimeError("phase turns stalled")
    return step_ends


def co_step_times(runs: Sequence[RunProfile], switch_s: float = 0.0) -> dict[str, float]:
    """Each run's step time T_co in the steady state of the group's round robin (what
    play_round_robin converges to): every run takes one step a round, so all share the round's
    length, computed exactly as the largest cycle mean of the round robin's precedence graph
    (Karp's algorithm) rather than read off a played start, whose ramp can hide for many rounds
    a pool that is just saturated. Removing a run never lengthens the round."""
    names = _distinct(runs)
    if len(runs) <= 1:
        return {p.run: p.solo_s for p in runs}
    return dict.fromkeys(names, _round_length(runs, switch_s))


def _distinct(runs: Sequence[RunProfile]) -> list[str]:
    names = [p.run for p in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"co-execution: a run listed twice in {names}")
    return names


def _round_length(runs: Sequence[RunProfile], switch_s: float) -> float:
    """The round robin as a timed event graph: node 2i is run i's rollout start, 2i+1 its train
    start; an arc u -> v (delay d, tokens m) says v in round k+m starts >= d after u in round k.
    A phase start pays the warm start when its pool serves more than one run."""
    n = 2 * len(runs)
    neg = float("-inf")
    arcs = [[[neg] * n for _ in range(n)] for _ in range(2)]  # arcs[m][u][v], m = 0 or 1 token

    def arc(u: int, v: int, delay: float, tokens: int) -> None:
        arcs[tokens][u][v] = max(arcs[tokens][u][v], delay)

    pools = _pools(runs)
    members = {pool: [i for i, p in enumerate(runs) if p.uses(pool)] for pool in pools}
    warm = {pool: switch_s if len(members[pool]) > 1 else 0.0 for pool in pools}
    for i, p in enumerate(runs):
        arc(2 * i, 2 * i + 1, p.rollout_s + warm[TRAIN], 0)
        arc(2 * i + 1, 2 * i, p.train_s + warm[p.rollout_pool], 1)
    for pool, order in members.items():
        node = 1 if pool == TRAIN else 0
        for a, b in zip(order, order[1:] + order[:1]):  # each pool serves its runs in group order, round by round
            arc(2 * a + node, 2 * b + node, runs[a].phase_s(pool) + warm[pool], 0 if b > a else 1)
    # within a round (0 tokens) the graph is acyclic: longest paths close it, x(k) = closure (x) arcs1 (x) x(k-1)
    close = [[0.0 if u == v else arcs[0][u][v] for v in range(n)] for u in range(n)]
    for w in range(n):
        for u in range(n):
            if close[u][w] == neg:
                continue
            for v in range(n):
                if close[w][v] != neg and close[u][w] + close[w][v] > close[u][v]:
                    close[u][v] = close[u][w] + close[w][v]
    step = [[max(arcs[1][u][w] + close[w][v] for w in range(n)) for v in range(n)] for u in range(n)]
    # Karp: the largest mean over cycles of `step`, each cycle one round per arc
    walks = [[0.0] * n]
    for _ in range(n):
        prev = walks[-1]
        walks.append([max(prev[u] + step[u][v] for u in range(n)) for v in range(n)])
    return max(min((walks[n][v] - walks[k][v]) / (n - k) for k in range(n) if walks[k][v] != neg)
               for v in range(n) if walks[n][v] != neg)


def _pools(runs: Iterable[RunProfile]) -> tuple[str, ...]:
    return (*sorted({p.rollout_pool for p in runs}), TRAIN)


@dataclass(frozen=True)
class CoexecGroup:
    name: str
    runs: tuple[RunProfile, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a co-execution group needs a name")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"group {self.name}: a run listed twice in {list(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.run for p in self.runs)

    def with_run(self, run: RunProfile) -> "CoexecGroup":
        return replace(self, runs=(*(p for p in self.runs if p.run != run.run), run))

    def without(self, run: str) -> "CoexecGroup":
        return replace(self, runs=tuple(p for p in self.runs if p.run != run))

    @property
    def pools(self) -> tuple[str, ...]:
        return _pools(self.runs)

    def parked_bytes(self, pool: str) -> int:
        return sum(p.parked_bytes(pool) for p in self.runs if p.uses(pool))

    def runs_on(self, pool: str) -> tuple[str, ...]:
        return tuple(p.run for p in self.runs if p.uses(pool))

    def step_times(self, limits: PoolLimits) -> dict[str, float]:
        return co_step_times(self.runs, limits.switch_s)


@dataclass(frozen=True)
class Admission:
    run: str
    group: str
    admitted: bool
    reason: str  # why not ("" when admitted)
    step_times: dict[str, float] = field(default_factory=dict)  # run -> T_co in the group with it


def _residency(group: CoexecGroup, run: RunProfile, limits: PoolLimits) -> str:
    for pool in (run.rollout_pool, TRAIN):
        have, others, mine = limits.host_bytes(pool), group.parked_bytes(pool), run.parked_bytes(pool)
        if others + mine > have:
            held = f"{_gib(others)} parked by {', '.join(group.runs_on(pool))} + " if group.runs_on(pool) else ""
            return (f"run {run.run} does not fit group {group.name}: {pool} pool host memory {_gib(have)} "
                    f"< {held}{_gib(mine)} parked by {run.run}")
    return ""


def fits(group: CoexecGroup, run: RunProfile, limits: PoolLimits) -> str:
    """Room for `run` in `group` (its size cap, each pool's host memory), the SLO aside: why not,
    or ""."""
    others = group.without(run.run)
    if limits.max_runs is not None and len(others.runs) + 1 > limits.max_runs:
        return f"group {group.name} has {len(others.runs)} runs, at most {limits.max_runs}"
    return _residency(others, run, limits)


def check_admission(group: CoexecGroup, run: RunProfile, limits: PoolLimits) -> Admission:
    """May `run` join `group`? Room first (cheap), then the SLO rule for every member."""
    group = group.without(run.run)  # re-admission with fresh measurements
    if why := fits(group, run, limits):
        return Admission(run.run, group.name, False, why)
    joined = group.with_run(run)
    # a round holds the slowest run's whole step and every run's phase on each pool: a lower bound
    # on every T_co that turns a saturated group away before the round's length is computed
    floor = max(max(p.solo_s for p in joined.runs),
                *(sum(p.phase_s(pool) for p in joined.runs if p.uses(pool)) for pool in joined.pools))
    if tight := [p for p in joined.runs if floor > p.slo_factor * p.solo_s * (1 + 1e-9)]:
        worst = min(tight, key=lambda p: p.slo_factor * p.solo_s)
        return Admission(run.run, group.name, False,
                         f"run {run.run} in group {group.name} would slow run {worst.run} to at least {floor:.1f} s "
                         f"a step, {floor / worst.solo_s:.2f}x its solo {worst.solo_s:.1f} s "
                         f"(SLO {worst.slo_factor:g}x)")
    times = joined.step_times(limits)
    late = [p for p in joined.runs if times[p.run] > p.slo_factor * p.solo_s * (1 + 1e-9)]
    if late:
        worst = max(late, key=lambda p: times[p.run] / p.solo_s)
        why = (f"run {run.run} in group {group.name} would slow run {worst.run} to {times[worst.run]:.1f} s a step, "
               f"{times[worst.run] / worst.solo_s:.2f}x its solo {worst.solo_s:.1f} s (SLO {worst.slo_factor:g}x)")
        return Admission(run.run, group.name, False, why, times)
    return Admission(run.run, group.name, True, "", times)


@dataclass(frozen=True)
class Placement:
    run: str
    group: str  # the group the run is in now
    new_group: bool  # a group of its own, made for it
    reason: str  # why not the group it asked for ("" when admitted there)
    step_times: dict[str, float] = field(default_factory=dict)


def join_group(groups: Iterable[CoexecGroup], name: str, run: RunProfile, limits: PoolLimits) -> Placement:
    """Put `run` in group `name` (made if no such group exists) when admitted there; else in a new
    group of its own, named after the run, and say why."""
    alone = check_admission(CoexecGroup(run.run), run, limits)
    if not alone.admitted:
        raise CoexecGroupError(alone.reason)
    group = next((g for g in groups if g.name == name), CoexecGroup(name))
    asked = check_admission(group, run, limits)
    if asked.admitted:
        return Placement(run.run, group.name, not group.runs, "", asked.step_times)
    return Placement(run.run, run.run, True, f"{asked.reason}; it runs in a group of its own", alone.step_times)
