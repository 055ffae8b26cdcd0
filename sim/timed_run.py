"""One simulation as a figure runs it: its summary, the router's decision times, the CPU seconds it
took, and, for a fixed configuration that sets the SLO, judged at 2x its own serving P99s.

The same function runs in one process (sim/paper_figures.py's runs()) and as one Prefect task on a
Dask worker (flows/paper_figures.py), so both give the same rows.
"""
from __future__ import annotations

import time

from executors.policies.prediction_margin import nearest_rank
from executors.policies.slo_admission import SLOConfig
from sim.cluster import ClusterSim
from sim.config import SimConfig
from sim.report import judged_at
from sim.workload import WorkloadSpec


def simulate(cfg: SimConfig, spec: WorkloadSpec | None = None, own_slo: bool = False) -> dict:
    """One simulation; with own_slo (a fixed configuration), judged at the SLO it sets: 2x its
    serving P99s (sim.report.judged_at: its serving GPUs never read the SLO)."""
    cpu = time.process_time()
    sim = ClusterSim(cfg, workload=spec)
    route, took = sim.router.route, []

    def timed(*a, **k):
        t = time.perf_counter()
        out = route(*a, **k)
        took.append(time.perf_counter() - t)
        return out
    sim.router.route = timed
    r = sim.run()
    if own_slo:
        r = judged_at(sim, r, SLOConfig(2 * r["ttft_p99_s"], 2 * r["tpot_p99_s"]))
    r["route_p99_ms"] = 1e3 * nearest_rank(sorted(took), 0.99) if took else None
    r["route_calls"] = len(took)
    r["cpu_s"] = time.process_time() - cpu
    return r
