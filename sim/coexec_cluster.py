"""Co-execution at cluster scale (issue 39 item 5): RL jobs arrive (sim/coexec_jobs.py) and are
placed in co-execution groups by the product's own policy (executors/policies/coexec_group.py:
admission by residency and the SLO rule, T_co from the phase-level round robin), or by a baseline;
the cluster provisions each group's rollout and training pools for as long as it has jobs.

Placements, after RollMux §4.2 and §7.5:
- "solo": solo disaggregation, every job its own rollout and training pools.
- "rollmux": the placement that admits the job at the least added cost ($/h, Table 1 prices):
  into a rollout pool of a group (direct packing) or a new rollout pool of a group (rollout
  scaling; the trainer pool shared), or a group of its own when that costs no more.
- "random": a group picked at random among those with room (host memory, size cap) on one of its
  rollout pools, and a new one; the pool with room picked at random; the SLO unchecked.
- "most_idle": the group with room whose pools idle most under its round robin, on its least
  loaded rollout pool with room; a new group when none idles. The SLO unchecked.

A pool is as large as its largest job (rollout GPUs = training GPUs for each job, Solo-D's 1:1),
and a group's pools are provisioned while it has jobs. A job advances one step per T_co of its
group as it is then, so a job joining or leaving changes its group-mates' pace from that moment.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field, replace

from executors.policies.coexec_group import (
    ROLLOUT,
    TRAIN,
    CoexecGroup,
    PoolLimits,
    RunProfile,
    check_admission,
    co_step_times,
    fits,
)
from sim.coexec_jobs import NODE_HOST_BYTES, PRICE_PER_H, Job

PLACEMENTS = ("solo", "rollmux", "random", "most_idle")


@dataclass
class _Group:
    group: CoexecGroup
    jobs: dict[str, Job] = field(default_factory=dict)
    t_co: dict[str, float] = field(default_factory=dict)

    def gpus(self, pool: str) -> int:
        return max((self.jobs[r].gpus for r in self.group.runs_on(pool)), default=0)

    @property
    def rollout_gpus(self) -> int:
        return sum(self.gpus(pool) for pool in self.group.pools if pool != TRAIN)

    @property
    def train_gpus(self) -> int:
        return self.gpus(TRAIN)

    def idle_share(self) -> float:
        """The share of its pools' time the round robin leaves idle."""
        cycle = max(self.t_co.values())
        busy = sum(p.rollout_s + p.train_s for p in self.group.runs)
        return 1 - busy / (len(self.group.pools) * cycle)

    def new_rollout_pool(self) -> str:
        return next(f"{ROLLOUT}/{k}" for k in range(len(self.group.pools) + 1)
                    if f"{ROLLOUT}/{k}" not in self.group.pools)


def _cost_per_h(rollout_gpus: int, train_gpus: int) -> float:
    return rollout_gpus * PRICE_PER_H["rollout"] + train_gpus * PRICE_PER_H["train"]


def _cost_with(g: _Group, job: Job, run: RunProfile) -> float:
    """What `g` costs an hour with `job` rolling out on `run.rollout_pool`."""
    roll = sum(max(g.gpus(pool), job.gpus) if pool == run.rollout_pool else g.gpus(pool)
               for pool in g.group.pools if pool != TRAIN)
    if run.rollout_pool not in g.group.pools:
        roll += job.gpus
    return _cost_per_h(roll, max(g.train_gpus, job.gpus))


@dataclass
class _Progress:
    job: Job
    group: str = ""
    steps_done: float = 0.0
    since_h: float = 0.0  # steps_done counted up to here
    t_co: float = 0.0
    worst_ratio: float = 1.0  # the largest T_co / T_solo it ran at
    finish_h: float = 0.0


@dataclass(frozen=True)
class CoexecOutcome:
    placement: str
    jobs: int
    gpu_hours: float  # rollout + training GPUs provisioned, integrated until the last job ends
    cost_usd: float  # the same at Table 1's prices
    peak_gpus: int
    mean_gpus: float
    makespan_h: float
    groups_made: int
    slo_attainment: float  # share of jobs whose every step ran within its SLO factor
    worst_ratio: float  # the largest T_co / T_solo of any job
    worst_of_slo: float  # the largest (T_co / T_solo) / SLO factor of any job: <= 1 meets every SLO
    mean_slowdown: float  # job completion time / its solo duration, mean over jobs
    mean_group_size: float  # jobs a group, time-weighted while it has any

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def simulate(jobs: list[Job], placement: str, switch_s: float = 5.9, max_runs: int = 5,
             host_bytes: int = NODE_HOST_BYTES, seed: int = 0) -> CoexecOutcome:
    """Place `jobs` as they arrive and run them to completion; what the cluster provisioned.
    `switch_s`: a warm start each time a pool passes to another job (RollMux: 0.8-5.9 s)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}: one of {', '.join(PLACEMENTS)}")
    if not jobs:
        raise ValueError("simulate needs at least one job")
    limits = PoolLimits(host_bytes, host_bytes, switch_s=switch_s, max_runs=max_runs)
    rng = random.Random(f"{placement}/{seed}")
    groups: dict[str, _Group] = {}
    progress: dict[str, _Progress] = {}
    finishes: list[tuple[float, str]] = []  # lazily deleted: a job's entry is live if it matches finish_h
    made = 0
    now = gpu_h = cost = mean_size_num = busy_group_h = 0.0
    peak = 0
    arrivals = sorted(jobs, key=lambda j: j.arrival_h)

    def provisioned() -> int:
        return sum(g.rollout_gpus + g.train_gpus for g in groups.values())

    def advance(to_h: float) -> None:
        nonlocal now, gpu_h, cost, mean_size_num, busy_group_h
        dt = to_h - now
        gpu_h += provisioned() * dt
        cost += sum(_cost_per_h(g.rollout_gpus, g.train_gpus) for g in groups.values()) * dt
        mean_size_num += sum(len(g.jobs) for g in groups.values()) * dt
        busy_group_h += len(groups) * dt
        now = to_h

    def repace(name: str) -> None:
        """The group's membership changed now: bank its jobs' steps, re-estimate T_co, reschedule."""
        g = groups[name]
        for p in (progress[j] for j in g.jobs):
            p.steps_done += (now - p.since_h) * 3600 / p.t_co if p.t_co else 0.0
            p.since_h = now
        g.t_co = co_step_times(g.group.runs, switch_s) if g.jobs else {}
        for j, t in g.t_co.items():
            p = progress[j]
            p.t_co = t
            p.worst_ratio = max(p.worst_ratio, t / p.job.run.solo_s)
            p.finish_h = now + max(0.0, p.job.steps - p.steps_done) * t / 3600
            heapq.heappush(finishes, (p.finish_h, j))

    def choose(job: Job) -> tuple[str, RunProfile] | None:
        """The group to join and the job's run profile there (its rollout pool), or None for a new group."""
        if placement == "solo" or not groups:
            return None
        if placement == "rollmux":
            own = _cost_per_h(job.gpus, job.gpus)
            best: tuple[float, int, str, str] | None = None
            for name, g in groups.items():
                for pool in (*(p for p in g.group.pools if p != TRAIN), g.new_rollout_pool()):
                    run = replace(job.run, rollout_pool=pool)
                    delta = _cost_with(g, job, run) - _cost_per_h(g.rollout_gpus, g.train_gpus)
                    if delta >= own or (best is not None and (delta, -len(g.jobs)) >= best[:2]):
                        continue
                    if check_admission(g.group, run, limits).admitted:
                        best = (delta, -len(g.jobs), name, pool)
            return (best[2], replace(job.run, rollout_pool=best[3])) if best else None
        room = {name: [replace(job.run, rollout_pool=p) for p in g.group.pools
                       if p != TRAIN and not fits(g.group, replace(job.run, rollout_pool=p), limits)]
                for name, g in groups.items()}
        room = {name: runs for name, runs in room.items() if runs}
        if placement == "random":
            names = sorted(room)
            pick = rng.randrange(len(names) + 1)
            return (names[pick], rng.choice(room[names[pick]])) if pick < len(names) else None
        idle = [(groups[n].idle_share(), n) for n in sorted(room)]
        top_idle, top = max(idle, default=(0.0, ""))
        if top_idle <= 0:
            return None
        g = groups[top]
        return top, min(room[top], key=lambda r: sum(p.rollout_s for p in g.group.runs if p.uses(r.rollout_pool)))

    i = 0
    while True:
        while finishes and progress[finishes[0][1]].finish_h != finishes[0][0]:
            heapq.heappop(finishes)  # superseded by a re-pace
        if i == len(arrivals) and not finishes:
            break
        next_arrival = arrivals[i].arrival_h if i < len(arrivals) else float("inf")
        if finishes and finishes[0][0] <= next_arrival:
            when, name = heapq.heappop(finishes)
            advance(when)
            p = progress[name]
            p.steps_done, p.finish_h, p.since_h = float(p.job.steps), -1.0, when
            g = groups[p.group]
            del g.jobs[name]
            g.group = g.group.without(name)
            if g.jobs:
                repace(p.group)
            else:
                del groups[p.group]
            continue
        job = arrivals[i]
        i += 1
        advance(job.arrival_h)
        chosen = choose(job)
        if chosen is None:
            made += 1
            chosen = f"g{made}", job.run
            groups[chosen[0]] = _Group(CoexecGroup(chosen[0]))
        target, run = chosen
        g = groups[target]
        g.jobs[job.name] = job
        g.group = g.group.with_run(run)
        progress[job.name] = _Progress(job, target, since_h=now)
        repace(target)
        peak = max(peak, provisioned())

    done = list(progress.values())
    attained = [p.worst_ratio <= p.job.run.slo_factor * (1 + 1e-9) for p in done]
    return CoexecOutcome(
        placement=placement, jobs=len(done), gpu_hours=gpu_h, cost_usd=cost, peak_gpus=peak,
        mean_gpus=gpu_h / now if now else 0.0, makespan_h=now, groups_made=made,
        slo_attainment=sum(attained) / len(done),
        worst_ratio=max(p.worst_ratio for p in done),
        worst_of_slo=max(p.worst_ratio / p.job.run.slo_factor for p in done),
        mean_slowdown=sum((p.since_h - p.job.arrival_h) / p.job.solo_h for p in done) / len(done),
        mean_group_size=mean_size_num / busy_group_h if busy_group_h else 0.0)
