"""Engine arguments and environment per device: the GPU settings are built and checked without a
GPU (no engine starts here)."""
from pathlib import Path

import pytest

from executors.engine.device import DeviceSpec, engine_setup
from core.config import StackConfig
from rose.stack.dask_cluster import worker_env, worker_specs

CPU_ONLY = ("VLLM_TARGET_DEVICE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
            "VLLM_CPU_NUM_OF_RESERVED_CPU")


def _setup(role, device, **kw):
    return engine_setup(role, device, model_dir=Path("/m"), max_model_len=512, max_num_seqs=8,
                        **kw)


def test_a_gpu_serving_worker_splits_the_device_serving_first(tmp_path):
    spec = next(s for s in worker_specs(1, 1, 1, device="cuda") if s.kind == "serving")
    assert spec.device == "cuda" and spec.core is None
    env = worker_env(spec, tmp_path, {})
    assert not set(CPU_ONLY) & set(env)  # no CPU-only setting on a GPU worker
    device = DeviceSpec.from_env(env)  # what the worker's engine builders read
    assert device.kind == "cuda"
    serving, s_env = _setup("serving", device, core=spec.core)
    rollout, r_env = _setup("rollout", device, core=spec.core)
    assert serving["gpu_memory_utilization"] == 0.5 and rollout["gpu_memory_utilization"] == 0.3
    assert serving["gpu_memory_utilization"] + rollout["gpu_memory_utilization"] <= 0.95
    # vLLM sizes each KV pool from its fraction; the memory policy counts those real blocks
    assert "num_gpu_blocks_override" not in serving and "num_gpu_blocks_override" not in rollout
    assert not set(CPU_ONLY) & (set(s_env) | set(r_env))
    with pytest.raises(ValueError, match="kv_blocks"):
        _setup("serving", device, kv_blocks=64)


def test_fractions_are_configurable_and_checked():
    env = {"ROSE_DEVICE": "cuda", "ROSE_GPU_SERVING_FRACTION": "0.6",
           "ROSE_GPU_ROLLOUT_FRACTION": "0.25"}
    kwargs, _ = _setup("rollout", DeviceSpec.from_env(env))
    assert kwargs["gpu_memory_utilization"] == 0.25
    with pytest.raises(ValueError, match="leave"):
        DeviceSpec("cuda", serving_fraction=0.7, rollout_fraction=0.3)
    with pytest.raises(ValueError, match="device"):
        DeviceSpec("tpu")


def test_cpu_worker_keeps_its_cpu_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path / "data"))
    spec = next(s for s in worker_specs(1, 1, 1, ncores=2) if s.kind == "serving")
    env = worker_env(spec, tmp_path / "stack", {})
    # vLLM's caches outlive a stack: beside the models, where the next stack finds them
    assert env["VLLM_CACHE_ROOT"] == str(tmp_path / "data" / "models" / ".vllm-cache")
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["VLLM_CPU_OMP_THREADS_BIND"] == str(spec.core)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["ROSE_DEVICE"] == "cpu"
    kwargs, _ = _setup("serving", DeviceSpec.from_env(env), kv_blocks=64)
    assert kwargs["num_gpu_blocks_override"] == 64 and "gpu_memory_utilization" not in kwargs
    assert StackConfig().device == "cpu" and StackConfig(device="cuda").device == "cuda"


def test_engine_args_are_real_vllm_engine_args():
    """Every keyword we build is an EngineArgs field (vLLM's own dataclass, no engine built)."""
    import dataclasses

    from vllm import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    for role in ("serving", "rollout", "dedicated"):
        kwargs, _ = _setup(role, DeviceSpec("cuda"), max_num_batched_tokens=512)
        assert set(kwargs) <= fields, set(kwargs) - fields


def test_trainer_is_niced_on_one_cpu_machine_only():
    cpu = {s.kind: s.nice for s in worker_specs(1, 1, 1, ncores=2)}
    assert cpu["trainer"] > 0 and cpu["rollout"] == cpu["serving"] == 0
    assert all(s.nice == 0 for s in worker_specs(1, 1, 1, device="cuda"))


def test_managed_process_starts_at_its_niceness(tmp_path):
    import os
    import sys

    from rose.stack.process import ManagedProcess

    proc = ManagedProcess("niced", [sys.executable, "-c", "import os; print(os.nice(0))"],
                          tmp_path, nice=7).start()
    proc.popen.wait(timeout=30)
    assert int(proc.log_path.read_text().split()[-1]) == os.nice(0) + 7


def test_engine_workers_import_vllm_as_they_start(tmp_path, monkeypatch, caplog):
    """Rollout and serving workers are started with the engine preload, the trainer is not;
    the preload imports on one daemon thread per process, which an engine build waits for;
    a failed import is logged, not raised (the engine build reports it where a task sees it)."""
    import threading

    from executors.engine import preload
    from executors.workers import engine_preload
    from rose.stack.dask_cluster import ENGINE_PRELOAD, worker_command

    for spec in worker_specs(1, 1, 1):
        cmd = worker_command(spec, "tcp://127.0.0.1:1", tmp_path)
        preloaded = "--preload" in cmd and cmd[cmd.index("--preload") + 1] == ENGINE_PRELOAD
        assert preloaded == (spec.kind in ("rollout", "serving")), spec.kind
    release, imported = threading.Event(), []
    monkeypatch.setattr(preload, "_thread", None)
    monkeypatch.setattr(preload, "import_engine_modules",
                        lambda: release.wait(10) and imported.append(1))
    engine_preload.dask_setup(None)
    first = preload._thread
    engine_preload.dask_setup(None)
    assert preload._thread is first and first.is_alive()  # once per process, still importing
    waiter = threading.Thread(target=preload.wait_for_engine_import)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # an engine build waits for the import
    release.set()
    waiter.join(10)
    assert not waiter.is_alive() and imported == [1]

    def broken() -> None:
        raise ImportError("no vllm here")
    monkeypatch.setattr(preload, "_thread", None)
    monkeypatch.setattr(preload, "import_engine_modules", broken)
    with caplog.at_level("ERROR", logger=preload.__name__):
        preload.import_engine_in_background()
        preload.wait_for_engine_import()
    assert "importing vLLM ahead of the engine failed" in caplog.text
