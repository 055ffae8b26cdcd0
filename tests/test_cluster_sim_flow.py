"""The cluster-sim flow fans simulations out as Prefect tasks on Dask (flows/cluster_sim.py).

Slow-ish (Prefect's temporary server and a local Dask cluster start, ~30 s): a 2-scale sweep
with both pipeline modes; every (scale, configuration, mode) comes back once, each a task run,
and its result equals the same simulation run in this process (the fan-out changes nothing).
"""
from __future__ import annotations

import pytest

from flows.cluster_sim import SimSweep

pytestmark = pytest.mark.slow


def test_sweep_rejects_an_unknown_configuration():
    with pytest.raises(ValueError, match="unknown configurations \\['fast'\\]"):
        SimSweep(configs=["rose", "fast"])


def test_sweep_takes_a_gpu_fleet_by_name():
    with pytest.raises(ValueError, match="h100_qwen3_8b"):
        SimSweep(fleet="h800_qwen3_8b")
    base = SimSweep(fleet="h100_qwen3_8b").base(16)
    assert base.rollout_profile == "h100_qwen3_8b" and base.serving_length_scale == 1.0
    assert SimSweep(fleet="h100_qwen3_8b", rate=2.0).base(16).serving_rate == 2.0
    assert SimSweep().base(16).rollout_profile == "cpu_policy"


def test_sweep_takes_the_papers_workload_by_name():
    with pytest.raises(ValueError, match="workload_paper_qwen3_8b_frozenlake"):
        SimSweep(workload="workload_paper_qwen3_8b")  # the message lists the shipped ones
    base = SimSweep(fleet="h100_qwen3_8b", workload="workload_paper_qwen3_8b_frozenlake").base(16)
    assert base.workload == "workload_paper_qwen3_8b_frozenlake"
    assert base.rollout_kv_s_per_token > 0 and base.rollout_kv_blocks  # the fleet's long-context terms


def test_sweep_runs_one_task_per_simulation_and_matches_a_local_run(monkeypatch, tmp_path):
    from dataclasses import asdict

    from distributed import LocalCluster

    from prefect.testing.utilities import prefect_test_harness

    from flows.cluster_sim import cluster_sim, simulate

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))  # no local stack here
    # The harness scopes a temporary server to this block; Prefect's implicit one would stay
    # the default for every later in-process flow and take their flow runs (test_e2e_step
    # then found its flow run there and its Dask workers' task runs on the stack's server).
    with prefect_test_harness(), \
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        sweep = SimSweep(scales=[4, 8], configs=["rose"], off_policy=[0, 1], steps=2,
                         dask_scheduler=cluster.scheduler_address)
        rows = cluster_sim(sweep)
    keys = sorted((r["gpus"], r["config"], r["off_policy"]) for r in rows)
    assert keys == sorted((g, c, k) for g in (4, 8) for c in ("fixed", "rose") for k in (0, 1))
    assert all(r["trajectories_finished"] == r["trajectories_started"] for r in rows)
    [row] = [r for r in rows if (r["gpus"], r["config"], r["off_policy"]) == (8, "rose", 1)]
    base = asdict(sweep.base(8)) | {"config": "rose", "off_policy": 1,
                                    "slo_ttft_s": row["slo_ttft_s"], "slo_tpot_s": row["slo_tpot_s"]}
    local = simulate.fn(base)
    assert {k: v for k, v in local.items() if k != "wall_s"} == \
        {k: v for k, v in row.items() if k not in ("wall_s", "speedup_vs_fixed")}
