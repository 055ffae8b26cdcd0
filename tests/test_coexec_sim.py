"""The co-execution simulator (sim/coexec_jobs.py, sim/coexec_cluster.py): RollMux's Table 6 jobs,
the product's group policy placing them, GPU-hours against solo disaggregation, every run within
its SLO factor, and the bench that tabulates it (bench/sim/coexec_sim.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from executors.policies.coexec_group import RunProfile
from sim.coexec_cluster import PLACEMENTS, simulate
from sim.coexec_jobs import GPUS, MIXES, TABLE6, Job, draw_jobs

ROOT = Path(__file__).resolve().parents[1]


def job(name: str, rollout_s: float, train_s: float, slo: float = 2.0, steps: int = 100, gpus: int = 8,
        arrival_h: float = 0.0, parked_gb: int = 200) -> Job:
    run = RunProfile(name, rollout_s, train_s, parked_gb * 10**9, parked_gb * 10**9, slo_factor=slo)
    return Job(name, "BL", "Small", gpus, arrival_h, steps, run)


def test_jobs_draw_from_table6_and_arrive_faster_on_a_larger_cluster():
    for mix in MIXES:
        jobs = draw_jobs(mix, 256, 120, seed=1)
        assert {j.profile for j in jobs} == (set(TABLE6) if mix == "Mixed" else {mix})
        for j in jobs:
            (r_lo, r_hi), (t_lo, t_hi) = TABLE6[j.profile][j.size]
            assert r_lo <= j.run.rollout_s <= r_hi and t_lo <= j.run.train_s <= t_hi
            assert j.gpus == GPUS[j.size] and 1 <= j.run.slo_factor <= 2
    small, large = draw_jobs("BL", 64, 200), draw_jobs("BL", 1024, 200)
    assert large[-1].arrival_h < small[-1].arrival_h
    with pytest.raises(ValueError, match="unknown mix"):
        draw_jobs("XX", 64, 10)


def test_solo_disaggregation_provisions_each_job_for_its_solo_time():
    jobs = draw_jobs("Mixed", 128, 40, seed=2)
    solo = simulate(jobs, "solo")
    assert solo.gpu_hours == pytest.approx(sum(2 * j.gpus * j.solo_h for j in jobs))
    assert solo.slo_attainment == 1 and solo.mean_slowdown == pytest.approx(1) and solo.groups_made == len(jobs)


def test_complementary_jobs_share_pools_and_halve_the_gpu_hours():
    jobs = [job("a", 100, 10), job("b", 10, 100)]
    solo, co = simulate(jobs, "solo", switch_s=0), simulate(jobs, "rollmux", switch_s=0)
    assert co.groups_made == 1 and co.worst_ratio == pytest.approx(1)
    assert co.gpu_hours == pytest.approx(solo.gpu_hours / 2)


def test_rollmux_keeps_apart_what_would_break_an_slo_the_baselines_do_not_check():
    # two balanced twins fit each other's bubbles; a third makes a round 3 rollouts long: 1.5x, SLO 1.2x
    triplets = [job(n, 100, 100, slo=1.2, arrival_h=i * 0.01) for i, n in enumerate("abc")]
    co = simulate(triplets, "rollmux")
    assert co.groups_made == 2 and co.slo_attainment == 1 and co.worst_of_slo <= 1
    greedy = simulate(triplets, "most_idle")
    assert greedy.groups_made == 1 and greedy.slo_attainment == 0


def test_rollout_heavy_jobs_get_rollout_pools_of_their_own_beside_one_trainer():
    # sharing one rollout pool would take 600 s a step against 350 s alone, over the SLO of 1.2x
    jobs = [job(n, 300, 50, slo=1.2, arrival_h=i * 0.01) for i, n in enumerate("abc")]
    co = simulate(jobs, "rollmux", switch_s=0)
    assert co.groups_made == 1 and co.slo_attainment == 1
    # three rollout pools, one trainer: 32 GPUs where solo takes 48
    assert co.peak_gpus == 4 * 8 and co.cost_usd < simulate(jobs, "solo").cost_usd


def test_no_host_memory_no_co_execution():
    jobs = [job("a", 100, 10), job("b", 10, 100)]
    assert simulate(jobs, "rollmux", host_bytes=0).groups_made == 2


@pytest.mark.parametrize("mix", MIXES)
def test_every_rollmux_run_stays_within_its_slo_at_cluster_scale(mix):
    jobs = draw_jobs(mix, 512, 60, seed=3)
    out = {p: simulate(jobs, p) for p in PLACEMENTS}
    assert out["rollmux"].slo_attainment == 1 and out["rollmux"].worst_of_slo <= 1 + 1e-9
    assert out["rollmux"].mean_group_size > 1  # it did co-execute
    assert all(o.jobs == len(jobs) for o in out.values())


def test_bench_writes_its_table_and_the_papers_numbers(tmp_path):
    out = tmp_path / "coexec_sim.json"
    subprocess.run([sys.executable, "-m", "bench.sim.coexec_sim", "--jobs", "12", "--scales", "64",
                    "--mixes", "BL", "--out", str(out)], check=True, capture_output=True, cwd=ROOT, timeout=300)
    doc = json.loads(out.read_text())
    assert {r["placement"] for r in doc["rows"]} == set(PLACEMENTS) and "sim_fig15_mixed" in doc["paper"]
    solo = next(r for r in doc["rows"] if r["placement"] == "solo")
    assert solo["solo_gpu_hours_x"] == 1
