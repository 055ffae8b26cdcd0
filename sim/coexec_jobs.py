"""RollMux's simulated job mixes (its Table 6) as arriving RL jobs, for the co-execution simulator
(sim/coexec_cluster.py).

A job's phase times are drawn from Table 6's uniform ranges (seconds per step) for its workload
profile and size; everything else is a choice, said here with its source:
- GPUs per job: Table 3's job types, Small = Type-A (Qwen2.5-7B, 8 rollout + 8 training GPUs),
  Medium = Type-B (14B, 8 + 8), Large = Type-C (32B, 16 + 16). Table 6 gives only times.
- parked state per node: Table 2 (GB to cache the rollout / training actor on an 8-GPU node):
  7B 275.7 / 240.0, 14B 445.4 / 456.1, 32B 490.3 / 520.4; host memory per node 2 TB (§3.2:
  "high-memory nodes (1-2 TB) ... a residency of two to five concurrent jobs").
- prices: Table 1, H20 (rollout) $1.85/h, H800 (training) $5.28/h.
- SLO factor ~ Unif(1, 2) per job (§7.4, §7.5 default); at most 5 runs a group (§7.5 default).
- arrivals: Poisson; a job's solo duration ~ exponential with the Philly segment's mean 14.4 h,
  at most its longest 142.9 h (§7.5; the trace itself is not published with the paper). The rate
  is set so that solo disaggregation keeps `cluster_gpus` busy on average: the cluster scale.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from executors.policies.coexec_group import RunProfile

GB = 10**9
MIXES = ("BL", "RH", "TH", "Mixed")
SIZES = ("Small", "Medium", "Large")

# Table 6: (rollout range, train range) in seconds, per profile and size
TABLE6: dict[str, dict[str, tuple[tuple[float, float], tuple[float, float]]]] = {
    "BL": {"Small": ((50, 100), (50, 100)), "Medium": ((100, 200), (100, 200)), "Large": ((200, 300), (200, 300))},
    "RH": {"Small": ((100, 200), (25, 50)), "Medium": ((200, 400), (50, 100)), "Large": ((400, 600), (100, 200))},
    "TH": {"Small": ((25, 50), (100, 200)), "Medium": ((50, 100), (200, 400)), "Large": ((100, 200), (400, 600))},
}
# Table 3 (GPUs per pool) and Table 2 (parked GB per node, rollout / train)
GPUS = {"Small": 8, "Medium": 8, "Large": 16}
PARKED_GB = {"Small": (275.7, 240.0), "Medium": (445.4, 456.1), "Large": (490.3, 520.4)}
NODE_HOST_BYTES = 2000 * GB
PRICE_PER_H = {"rollout": 1.85, "train": 5.28}  # Table 1, $ per GPU-hour
MEAN_SOLO_H, MAX_SOLO_H = 14.4, 142.9


@dataclass(frozen=True)
class Job:
    name: str
    profile: str  # BL, RH, TH
    size: str
    gpus: int  # per pool: rollout GPUs = training GPUs (Solo-D's 1:1)
    arrival_h: float
    steps: int
    run: RunProfile

    @property
    def solo_h(self) -> float:
        return self.steps * self.run.solo_s / 3600


def draw_jobs(mix: str, cluster_gpus: int, n_jobs: int, seed: int = 0, slo: tuple[float, float] = (1.0, 2.0)
              ) -> list[Job]:
    """`n_jobs` jobs of `mix` arriving at the rate that keeps `cluster_gpus` GPUs busy under solo
    disaggregation."""
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}: one of {', '.join(MIXES)}")
    if cluster_gpus < 1 or n_jobs < 1:
        raise ValueError(f"cluster_gpus and n_jobs must be >= 1, got {cluster_gpus}, {n_jobs}")
    if not 1 <= slo[0] <= slo[1]:
        raise ValueError(f"SLO range must satisfy 1 <= low <= high, got {slo}")
    rng = random.Random(f"{mix}/{cluster_gpus}/{seed}")
    profiles = list(TABLE6) if mix == "Mixed" else [mix]
    mean_gpus = sum(2 * GPUS[s] for s in SIZES) / len(SIZES)
    rate_per_h = cluster_gpus / (mean_gpus * MEAN_SOLO_H)  # Little's law: busy GPUs = rate x GPUs x time
    jobs, t = [], 0.0
    for i in range(n_jobs):
        t += rng.expovariate(rate_per_h)
        profile, size = rng.choice(profiles), rng.choice(SIZES)
        (r_lo, r_hi), (t_lo, t_hi) = TABLE6[profile][size]
        roll_gb, train_gb = PARKED_GB[size]
        run = RunProfile(f"j{i}", rng.uniform(r_lo, r_hi), rng.uniform(t_lo, t_hi),
                         int(roll_gb * GB), int(train_gb * GB), rng.uniform(*slo))
        solo_h = min(rng.expovariate(1 / MEAN_SOLO_H), MAX_SOLO_H)
        steps = max(1, math.ceil(solo_h * 3600 / run.solo_s))
        jobs.append(Job(run.run, profile, size, GPUS[size], t, steps, run))
    return jobs
