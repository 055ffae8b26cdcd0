"""Where an engine runs: its vLLM EngineArgs keyword arguments and its environment, in one place.

`engine_setup(role, device, ...)` is what every real engine builder uses (the dedicated rollout
engine, executors/engine/vllm_engine.py; the co-serving pair, executors/engine/budgeted_scheduler.py
through executors/coserving/engines.py), and what the stack puts in a worker's environment
(rose/stack/dask_cluster.py), so the CPU and CUDA settings cannot drift apart.

- cpu (default): VLLM_TARGET_DEVICE=cpu, the KV pool in VLLM_CPU_KVCACHE_SPACE GB (or
  `kv_blocks` blocks, an emulated device pool), OpenMP threads bound to the worker's core.
- cuda (the `gpu` extra): none of the CPU settings; the engines of one worker split the device
  by `gpu_memory_utilization`, serving first (serving 0.5 and rollout 0.3 of the device by
  default; a rollout worker's single engine 0.85). vLLM then sizes each KV pool from its
  fraction, and the co-serving memory policy counts the engine's real blocks
  (scheduler.usable_blocks()), so `kv_blocks` is refused there.

Plain Python (no vLLM import): tests check the arguments for a GPU worker without a GPU.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from core.modes import DEVICES

ROLES = ("serving", "rollout", "dedicated")  # co-serving pair, or a rollout worker's one engine
DEVICE_ENV = "ROSE_DEVICE"
FRACTION_ENV = {"serving": "ROSE_GPU_SERVING_FRACTION", "rollout": "ROSE_GPU_ROLLOUT_FRACTION",
                "dedicated": "ROSE_GPU_DEDICATED_FRACTION"}


@dataclass(frozen=True)
class DeviceSpec:
    kind: str = "cpu"
    serving_fraction: float = 0.5  # of the device's memory, taken first
    rollout_fraction: float = 0.3  # the borrowed rollout engine beside it
    dedicated_fraction: float = 0.85  # a rollout worker's only engine
    cpu_kv_space_gb: int = 1

    def __post_init__(self) -> None:
        if self.kind not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.kind!r}")
        for name in ("serving_fraction", "rollout_fraction", "dedicated_fraction"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be in (0, 1), got {getattr(self, name)}")
        if self.serving_fraction + self.rollout_fraction > 0.95:
            raise ValueError("serving_fraction + rollout_fraction must leave >= 5% of the device "
                             f"(activations, CUDA context), got {self.serving_fraction} + "
                             f"{self.rollout_fraction}")

    def fraction(self, role: str) -> float:
        if role not in ROLES:
            raise ValueError(f"engine role must be one of {ROLES}, got {role!r}")
        return getattr(self, f"{role}_fraction")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "DeviceSpec":
        """What the stack put in this worker's environment (cpu when nothing)."""
        env = os.environ if env is None else env
        fractions = {f"{role}_fraction": float(env[var]) for role, var in FRACTION_ENV.items()
                     if env.get(var)}
        return cls(env.get(DEVICE_ENV, "cpu") or "cpu", **fractions)

    def worker_env(self) -> dict[str, str]:
        """The variables from_env reads back on the worker."""
        return {DEVICE_ENV: self.kind,
                **{var: str(self.fraction(role)) for role, var in FRACTION_ENV.items()}}


def engine_env(device: DeviceSpec, core: int | None = None,
               cache_root: Path | None = None) -> dict[str, str]:
    """Environment of a process holding in-process engines on `device`."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # one process: engine state reachable
           "HF_HUB_OFFLINE": "1"}
    if cache_root is not None:
        env["VLLM_CACHE_ROOT"] = str(Path(cache_root).resolve())
    if device.kind == "cpu":
        env.update({"VLLM_TARGET_DEVICE": "cpu",
                    "VLLM_CPU_KVCACHE_SPACE": str(device.cpu_kv_space_gb)})
        if core is not None:  # engines of several processes would all bind core 0
            env.update(VLLM_CPU_OMP_THREADS_BIND=str(core), VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    return env


def engine_setup(role: str, device: DeviceSpec, *, model_dir: Path, max_model_len: int,
                 max_num_seqs: int, seed: int = 0, block_size: int = 32,
                 prefix_caching: bool = True, dtype: str = "bfloat16",
                 kv_blocks: int | None = None, core: int | None = None,
                 cache_root: Path | None = None, **extra) -> tuple[dict, dict[str, str]]:
    """(EngineArgs keyword arguments, environment) of one engine of `role` on `device`.

    block_size 32 suits both (CPU attention needs multiples of 32). `extra` goes to EngineArgs
    as is (scheduler_cls, max_num_batched_tokens, ...)."""
    fraction = device.fraction(role)
    kwargs = dict(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True, dtype=dtype,
                  enable_prefix_caching=prefix_caching, max_model_len=max_model_len,
                  max_num_seqs=max_num_seqs, seed=seed, block_size=block_size)
    if device.kind == "cuda":
        if kv_blocks is not None:
            raise ValueError("kv_blocks emulates a device pool on CPU; on cuda each engine's "
                             "pool is what its gpu_memory_utilization holds")
        kwargs["gpu_memory_utilization"] = fraction
    elif kv_blocks is not None:
        kwargs["num_gpu_blocks_override"] = kv_blocks
    kwargs.update(extra)
    return kwargs, engine_env(device, core, cache_root)


def apply_env(env: dict[str, str]) -> None:
    """Set what the stack did not already set (an explicit worker env wins)."""
    for key, value in env.items():
        os.environ.setdefault(key, value)
