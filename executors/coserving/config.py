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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, field_validator

from executors.policies.slo_admission import SLOConfig
from core.config import CoServingSettings
from core.modes import SERVING_MODES, ServingMode


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
assert set(WIRING) == set(SERVING_MODES), "every serving mode (core/modes.py) needs its wiring"


class CoServingConfig(CoServingSettings):
    """One co-serving executor: its two models, its mode and SLO, and the settings a stack
    config gives every serving worker (core/config.py CoServingSettings, `stack.coserving`).
    Built as CoServingConfig(serving_model_dir, rollout_model_dir, mode=..., kv_blocks=...)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)

    serving_model_dir: Path
    rollout_model_dir: Path
    mode: ServingMode = "rose"
    slo: SLOConfig | None = None  # None: SLOConfig.from_profile(serving profile), said in metrics

    def __init__(self, serving_model_dir: str | Path, rollout_model_dir: str | Path,
                 **settings: Any) -> None:
        super().__init__(serving_model_dir=serving_model_dir, rollout_model_dir=rollout_model_dir,
                         **settings)

    @field_validator("serving_model_dir", "rollout_model_dir")
    @classmethod
    def _model_dir(cls, path: Path, info) -> Path:
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{info.field_name} {path} has no config.json")
        return path

    @property
    def wiring(self) -> Wiring:
        return WIRING[self.mode]
