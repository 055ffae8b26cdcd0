"""Borrowing serving workers: which ones a run gets for an RL step, and the leases that lend
each to one run at a time.

Each step a run gives back what it held and asks again for up to `max_serving_workers`: it gets
the workers no other run holds, lowest serving load first (the larger of the worker's KV use by
serving and its recent TTFT P99 over the SLO: the least slack), so a worker whose users got busy
goes back to serving at the next step. A lease names the run and lapses unless renewed within
`ttl_s` (a driver that died frees its workers); a run releases its leases when it ends.

Plain data: the table round-trips through JSON, so the product keeps it in a file shared by the
runs' drivers (coordination/serving_leases.py) and the simulator can keep it in memory.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class BorrowPolicy:
    max_serving_workers: int | None = None  # per run and step; None: every free serving worker
    ttl_s: float = 60.0  # a lease not renewed this long is free again

    def __post_init__(self) -> None:
        if self.max_serving_workers is not None and self.max_serving_workers < 1:
            raise ValueError(f"max_serving_workers must be >= 1 or None, got {self.max_serving_workers}")
        if not self.ttl_s > 0:
            raise ValueError(f"lease ttl_s must be > 0, got {self.ttl_s}")


@dataclass(frozen=True)
class ServingLoad:
    """A serving worker's load as its own metrics report it."""

    worker: str
    kv_used: float  # share of the worker's KV pool serving holds now, 0..1
    ttft_p99_s: float | None = None  # over its recent serving requests; None: none served
    slo_ttft_s: float | None = None

    @property
    def pressure(self) -> float:
        """0: idle; 1: no slack left (KV full, or TTFT P99 at the SLO)."""
        ttft = (self.ttft_p99_s / self.slo_ttft_s
                if self.ttft_p99_s is not None and self.slo_ttft_s else 0.0)
        return max(self.kv_used, ttft)

    @classmethod
    def unknown(cls, worker: str) -> "ServingLoad":
        """A worker whose metrics did not answer: chosen last."""
        return cls(worker, 1.0)


@dataclass(frozen=True)
class ServingLease:
    worker: str
    run: str
    since: float  # when this run took the worker
    renewed: float
    ttl_s: float

    def expired(self, now: float) -> bool:
        return now - self.renewed > self.ttl_s


@dataclass(frozen=True)
class Grant:
    """What a run got for a step, and why not more (`note`, for its step summary)."""

    run: str
    asked: int | None  # max_serving_workers
    workers: list[str]  # lowest load first
    exist: int  # serving workers measured this step
    held_elsewhere: dict[str, str] = field(default_factory=dict)  # worker -> the run holding it
    fresh: list[str] = field(default_factory=list)  # granted, not held by the run a step ago
    expired: dict[str, str] = field(default_factory=dict)  # leases freed now: worker -> run
    dropped: dict[str, str] = field(default_factory=dict)  # granted, then given back: worker -> why

    @property
    def note(self) -> str:
        parts = []
        if self.asked is not None and self.asked > self.exist:
            parts.append(f"asked for {self.asked} serving workers, {self.exist} exist: "
                         "borrowing what there is")
        if self.held_elsewhere:
            held = ", ".join(f"{w} (run {r})" for w, r in sorted(self.held_elsewhere.items()))
            got = ", ".join(self.workers) if self.workers else "none"
            parts.append(f"held by other runs: {held}; borrowed {'the others: ' if self.workers else ''}{got}")
        parts += [f"{w} given back: {why}" for w, why in sorted(self.dropped.items())]
        return "; ".join(parts)

    def without(self, dropped: dict[str, str]) -> "Grant":
        """This grant less the workers given back (worker -> why)."""
        return replace(self, workers=[w for w in self.workers if w not in dropped],
                       fresh=[w for w in self.fresh if w not in dropped],
                       dropped={**self.dropped, **dropped})

    def as_dict(self) -> dict:
        return {**asdict(self), "note": self.note}


class LeaseTable:
    """Serving worker -> the lease lending it to a run."""

    def __init__(self, leases: dict[str, ServingLease] | None = None) -> None:
        self.leases = dict(leases or {})

    def expire(self, now: float) -> dict[str, str]:
        """Drop leases not renewed in time; worker -> the run that held it."""
        gone = {w: lease.run for w, lease in self.leases.items() if lease.expired(now)}
        for w in gone:
            del self.leases[w]
        return gone

    def grant(self, run: str, loads: list[ServingLoad], policy: BorrowPolicy, now: float) -> Grant:
        """Re-choose `run`'s serving workers for a step among those `loads` measured. A worker
        the run did not hold until now is `fresh` in the grant: only the workers a run holds get
        its weight publishes, so a fresh one must load the run's weights before its turns."""
        expired = self.expire(now)
        mine = {w: lease for w, lease in self.leases.items() if lease.run == run}
        for w in mine:
            del self.leases[w]
        held = {load.worker: self.leases[load.worker].run for load in loads if load.worker in self.leases}
        free = sorted((load for load in loads if load.worker not in held),
                      key=lambda load: (load.pressure, load.worker))
        chosen = [load.worker for load in free[:policy.max_serving_workers]]
        for w in chosen:
            since = mine[w].since if w in mine else now
            self.leases[w] = ServingLease(w, run, since, now, policy.ttl_s)
        fresh = [w for w in chosen if w not in mine]
        return Grant(run, policy.max_serving_workers, chosen, len(loads), held, fresh, expired)

    def renew(self, run: str, now: float) -> list[str]:
        """The run's driver is alive: its leases run another ttl. Returns the workers it holds."""
        mine = [w for w, lease in self.leases.items() if lease.run == run]
        for w in mine:
            lease = self.leases[w]
            self.leases[w] = ServingLease(w, run, lease.since, now, lease.ttl_s)
        return mine

    def release(self, run: str | None = None, workers: list[str] | None = None) -> dict[str, str]:
        """Free the run's leases (every run's: None; only these `workers`' when given);
        worker -> run freed."""
        freed = {w: lease.run for w, lease in self.leases.items()
                 if (run is None or lease.run == run) and (workers is None or w in workers)}
        for w in freed:
            del self.leases[w]
        return freed

    def held_by(self, run: str) -> list[str]:
        return sorted(w for w, lease in self.leases.items() if lease.run == run)

    def to_dict(self) -> dict:
        return {"leases": {w: asdict(lease) for w, lease in self.leases.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "LeaseTable":
        return cls({w: ServingLease(**lease) for w, lease in data.get("leases", {}).items()})
