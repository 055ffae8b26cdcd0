"""GPU fleets for the simulator (sim/fleet.py): derived from measured profiles and the models'
published shapes, and they change what the simulator runs."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sim.cluster import ClusterSim, _sample_prompts
from sim.config import SimConfig
from sim.fleet import FleetSpec, fleet_settings, load_fleet, shape_numbers
from sim.profiles import PROFILE_DIR, load_profile
from sim.workload import p90

ROOT = Path(__file__).resolve().parents[1]


def test_shapes_give_the_published_parameter_counts():
    # Qwen3-8B 8.2B, Qwen3-32B 32.8B, Qwen2.5-7B 7.6B parameters (their model cards)
    assert round(shape_numbers("qwen3-8b")[0] / 1e9, 1) == 8.2
    assert round(shape_numbers("qwen3-32b")[0] / 1e9, 1) == 32.8
    assert round(shape_numbers("qwen2.5-7b")[0] / 1e9, 1) == 7.6
    assert shape_numbers("qwen3-8b")[1] == 36 * 2 * 8 * 128 * 2  # K and V, 8 KV heads, bf16


def test_fleet_settings_follow_the_measured_profiles_and_the_device():
    spec = load_fleet("h100_qwen3_8b")
    settings, how = fleet_settings(spec)
    measured = json.loads((PROFILE_DIR / "h100_qwen3_8b_train.json").read_text())["train_s_per_token"]
    assert settings["train_s_per_token"] == measured and "measured" in how["train_s_per_token"]
    # the H200 fleet has no measured train step: 3x the forward per token at the longest prompt
    h200, how200 = fleet_settings(load_fleet("h200_qwen3_8b"))
    rollout = load_profile("h200_qwen3_8b")
    assert h200["train_s_per_token"] == pytest.approx(3 * rollout.prefill(8176) / 8176)
    assert settings["publish_s"] == pytest.approx(2 * 8.19e9 / 25e9, rel=1e-2)  # 16.4 GB at 200 Gbps
    bigger, _ = fleet_settings(replace(spec, gpu_memory_gb=2 * spec.gpu_memory_gb))
    assert bigger["kv_blocks"] > 2 * settings["kv_blocks"]  # weights are paid once
    busier, _ = fleet_settings(replace(spec, serving_utilization=2 * spec.serving_utilization))
    assert busier["serving_rate"] == pytest.approx(2 * settings["serving_rate"])
    assert "18.9%" in how["serving_rate"]


def test_models_that_do_not_fit_together_are_refused():
    spec = FleetSpec("h100_qwen3_32b", "h100_qwen3_32b", "qwen3-32b", "qwen3-32b", gpu_memory_gb=85.0)
    with pytest.raises(ValueError, match="do not fit"):
        fleet_settings(spec)
    with pytest.raises(ValueError, match="no architecture"):
        FleetSpec("a", "b", "qwen9-1t", "qwen3-8b", gpu_memory_gb=80)


def test_a_fleet_runs_gpu_engines_on_whole_serving_prompts():
    settings, _ = fleet_settings(load_fleet("h100_qwen3_8b"))
    h200, _ = fleet_settings(load_fleet("h200_qwen3_8b"))
    gpu = ClusterSim(SimConfig(gpus=4, steps=1, traj_per_rollout_gpu=16, **settings)).run()
    faster = ClusterSim(SimConfig(gpus=4, steps=1, traj_per_rollout_gpu=16, **h200)).run()
    # the engines run the fleet's measured curves (the H200's steps are faster than the H100's);
    # train and publish follow the fleet's step model
    assert faster["rollout_s_mean"] < gpu["rollout_s_mean"]
    assert gpu["per_step"][0]["publish_s"] == pytest.approx(settings["publish_s"])
    assert gpu["per_step"][0]["train_s"] == pytest.approx(
        gpu["per_step"][0]["tokens"] * settings["train_s_per_token"] / 2)
    # and the trace's prompts are replayed whole, not cut to 1/16 under a 2,048-token context
    whole = p90([r.prompt for r in _sample_prompts(SimConfig(**settings))])
    cut = p90([r.prompt for r in _sample_prompts(SimConfig())])
    assert whole > 8 * cut


def test_cluster_sim_fleet_flag_writes_its_own_result(tmp_path):
    out = tmp_path / "fleet.json"
    subprocess.run([sys.executable, "-m", "bench.sim.cluster_sim", "--fleet", "h100_qwen3_8b",
                    "--scales", "8", "--ablation-scale", "0", "--steps", "3", "--out", str(out)],
                   check=True, capture_output=True, cwd=ROOT, timeout=600)
    d = json.loads(out.read_text())
    assert d["fleet"]["settings"]["rollout_profile"] == "h100_qwen3_8b"
    assert {r["config"] for r in d["rows"]} == {"fixed", "rose", "slo_unaware", "static"}
    assert d["validation"] is None  # the local stack's check is about the CPU engines
    bad = subprocess.run([sys.executable, "-m", "bench.sim.cluster_sim", "--fleet", "h800"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode != 0 and "h100_qwen3_8b" in bad.stderr
    too_short = subprocess.run([sys.executable, "-m", "bench.sim.cluster_sim", "--fleet", "h100_qwen3_8b",
                                "--scales", "2", "--steps", "1", "--rate", "1e-6", "--out", str(tmp_path / "x.json")],
                               capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert too_short.returncode != 0 and "no serving request finished" in too_short.stderr


def test_fit_workload_reads_a_data_directorys_turns(tmp_path):
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sim.workload import WorkloadSpec, fit_data_directory

    t0, rows = datetime(2026, 1, 1, tzinfo=timezone.utc), []
    for traj in range(6):
        for turn in range(1 + traj % 3):  # 1, 2 or 3 turns; responses of 40 tokens
            rows.append(dict(run="r", trajectory=f"t{traj}", turn=turn, num_prompt_tokens=500 + 60 * turn,
                             response_ids=[7] * 40, env_s=0.5, trajectory_reward=float(traj % 2),
                             finished_at=t0 + timedelta(seconds=10 * traj + 2 * turn),
                             decode_s=0.4, prefill_s=0.1, queued_s=0.0))
    part = tmp_path / "data" / "trajectories" / "run=r" / "step=1"
    part.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "run"} for r in rows]),
                   part / "part-0.parquet")
    out = tmp_path / "workload_mine.json"
    assert fit_data_directory(tmp_path / "data", out).to_json() + "\n" == out.read_text()
    spec = WorkloadSpec.load(out)
    assert spec.q["response"][0] == spec.q["response"][-1] == 40
    assert spec.q["first_prompt"][0] == 500 and spec.q["turns"][-1] == 3
    assert spec.success_rate == 0.5
    with pytest.raises(FileExistsError):  # a second fit under the same name overwrites nothing
        fit_data_directory(tmp_path / "data", out)
    with pytest.raises(FileNotFoundError):
        fit_data_directory(tmp_path / "nothing", tmp_path / "workload_other.json")
