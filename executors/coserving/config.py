"""Co-serving executor configuration, and how each ablation mode wires the policies.

Modes (paper Tables 1 and 2). Only the wiring differs; the engines, the
control loop and the measurements are the same in all of them.
- serving_only: no rollout model at all (the reference for serving latency).
- static_partition: fixed 50/50 KV split, one rollout step after every serving step, no
  admission, no prefix cache for rollout.
- preemption: + per-step rollout KV budget, burst trigger, emergency cut, freeze.
- prefix: + rollout prefix cache kept under 10 s leases.
- rose: + dual-SLO admission (a rollout step runs only when its predicted cost fits the slack).
- unaware: rollout scheduled like serving: a rollout step after every serving step with
  vLLM's full token budget (no chunking), no admission, no memory policy.
- evict_reload: static 50/50 while the rollout model is up; when the serving load reaches
  evict_load_threshold the rollout engine is torn down (its turns aborted, reroutable) and
  rebuilt once the load has stayed at or below half that for reload_after_s (timed for real).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from executors.policies.slo_admission import SLOConfig

Mode = Literal["rose", "serving_only", "static_partition", "preemption", "prefix", "unaware",
               "evict_reload"]


@dataclass(frozen=True)
class Wiring:
    rollout: bool  # a rollout engine exists
    admission: bool  # dual-SLO gate on every rollout step
    memory_policy: bool  # KVMemoryPolicy: step budget, burst trigger, cut, freeze
    leases: bool  # finished turns' prefix blocks kept under leases
    prefix_cache: bool  # rollout engine's prefix caching
    chunked: bool  # rollout prefill chunked to chunk_tokens
    static_share: float | None  # fixed share of the KV pool for rollout
    evict_on_burst: bool


WIRING: dict[str, Wiring] = {
    "serving_only": Wiring(False, False, False, False, False, True, None, False),
    "static_partition": Wiring(True, False, False, False, False, True, 0.5, False),
    "preemption": Wiring(True, False, True, False, False, True, None, False),
    "prefix": Wiring(True, False, True, True, True, True, None, False),
    "rose": Wiring(True, True, True, True, True, True, None, False),
    "unaware": Wiring(True, False, False, False, True, False, None, False),
    "evict_reload": Wiring(True, False, False, False, True, True, 0.5, True),
}
MODES: tuple[str, ...] = tuple(WIRING)
BLOCK_SIZE = 32  # tokens per KV block (vLLM CPU attention wants multiples of 32)


@dataclass
class CoServingConfig:
    serving_model_dir: Path
    rollout_model_dir: Path
    mode: Mode = "rose"
    slo: SLOConfig | None = None  # None: SLOConfig.from_profile(serving profile), said in metrics
    reserve_fraction: float = 0.2
    chunk_tokens: int = 512
    stall_timeout_s: float = 2.0
    lease_s: float = 10.0
    kv_blocks: int | None = None  # per-engine KV pool in blocks; None: VLLM_CPU_KVCACHE_SPACE
    high_watermark: float = 0.5  # burst trigger: share of the reserve serving may eat
    cut_factor: int = 2
    max_model_len: int = 2048
    max_num_seqs: int = 64  # per engine; also the largest profiled decode batch
    usage_window_s: float = 30.0  # "recent serving usage" for start_step's budget
    evict_load_threshold: int = 8  # evict_reload: serving requests in flight that start a burst
    reload_after_s: float = 2.0  # evict_reload: calm time before rebuilding the rollout engine
    profile_repeats: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        self.serving_model_dir = Path(self.serving_model_dir)
        self.rollout_model_dir = Path(self.rollout_model_dir)
        for name in ("serving_model_dir", "rollout_model_dir"):
            if not (getattr(self, name) / "config.json").is_file():
                raise FileNotFoundError(f"{name} {getattr(self, name)} has no config.json")
        if self.mode not in WIRING:
            raise ValueError(f"unknown co-serving mode {self.mode!r}; expected one of {MODES}")
        if self.slo is not None and not isinstance(self.slo, SLOConfig):
            raise TypeError("slo must be an SLOConfig or None")
        if not 0 < self.reserve_fraction < 1:
            raise ValueError(f"reserve_fraction must be in (0, 1), got {self.reserve_fraction}")
        if not 1 <= self.chunk_tokens <= self.max_model_len:
            raise ValueError(f"chunk_tokens must be in 1..{self.max_model_len}, got {self.chunk_tokens}")
        for name in ("stall_timeout_s", "lease_s", "usage_window_s", "reload_after_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        if self.max_model_len < 2 * BLOCK_SIZE or self.max_model_len % BLOCK_SIZE:
            raise ValueError(f"max_model_len must be a multiple of {BLOCK_SIZE} >= {2 * BLOCK_SIZE}")
        full = self.max_model_len // BLOCK_SIZE + 1
        if self.kv_blocks is not None and self.kv_blocks < full:
            raise ValueError(f"kv_blocks={self.kv_blocks} cannot hold one {self.max_model_len}-token "
                             f"request; need >= {full}")
        if not 0 <= self.high_watermark <= 1 or self.cut_factor < 2:
            raise ValueError("high_watermark must be in [0, 1] and cut_factor >= 2")
        if self.max_num_seqs < 2 or self.profile_repeats < 1 or self.evict_load_threshold < 1:
            raise ValueError("max_num_seqs >= 2, profile_repeats >= 1, evict_load_threshold >= 1")

    @property
    def wiring(self) -> Wiring:
        return WIRING[self.mode]
