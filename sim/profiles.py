"""Latency profiles the simulator's engines run on: sim/profiles/<kind>_<model>.json.

Each file is a LatencyProfile (executors/policies/latency_profile.py format, read by its own
from_json) plus a "source" field saying where every number came from. Shipped: the local CPU
models, measured by the executor's start-up profiler on this machine, and the paper's models
(Qwen3-8B, Qwen3-32B, the 7B serving model) on an H100 (the H800's chip) and an H200, measured by
bench/engine_profile.py --backend torch on lent GPU machines (no vLLM there; the published vLLM
figures in gpu_sources.json are the check). A file with "tp_of" names a tensor-parallel engine
of a measured profile instead (sim/tp_profile.py), derived here on load.
"""
from __future__ import annotations

import json
from pathlib import Path

from executors.policies.latency_profile import Curve, LatencyProfile
from sim.tp_profile import TPSharding

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"


def load_profile(name: str) -> LatencyProfile:
    """A shipped profile by file stem, e.g. "cpu_policy" or "cpu_serving"."""
    path = PROFILE_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no simulator profile {name!r} in {PROFILE_DIR}")
    d = json.loads(path.read_text())
    if "tp_of" in d:
        return _memoized(tp_sharding(name).shard(load_profile(d["tp_of"])))
    return _memoized(LatencyProfile.load(path))


def tp_sharding(name: str) -> TPSharding:
    """The TP derivation a "tp_of" profile file names, its layers and width from its shape."""
    d = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    c = json.loads((PROFILE_DIR / "shapes" / d["shape"] / "config.json").read_text())
    return TPSharding(int(d["tp"]), c["num_hidden_layers"], c["hidden_size"], float(d["nvlink_gb_s"]),
                      float(d.get("allreduce_latency_s", 0.0)))


def profile_source(name: str) -> str:
    return str(json.loads((PROFILE_DIR / f"{name}.json").read_text()).get("source", ""))


def scaled(profile: LatencyProfile, factor: float) -> LatencyProfile:
    """Every latency times `factor`: an engine given 1/factor of a device (static partition)."""
    if factor <= 0:
        raise ValueError(f"scale factor must be > 0, got {factor}")

    def s(c: Curve) -> Curve:
        return _MemoCurve(c.xs, tuple(y * factor for y in c.ys))

    return LatencyProfile(s(profile.monolithic), s(profile.chunked), s(profile.decode),
                          profile.chunk_size, f"{profile.name} x{factor:g}")


class _MemoCurve(Curve):
    """A Curve that remembers its answer per size: the simulator asks the same few sizes
    (batch sizes, chunk and prompt lengths) millions of times. Each answer is Curve's own
    evaluation, computed once, so every prediction the policies see is unchanged."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "_memo", {})

    def __call__(self, x: float) -> float:
        y = self._memo.get(x)
        if y is None:
            y = self._memo[x] = Curve.__call__(self, x)
        return y


def _memoized(p: LatencyProfile) -> LatencyProfile:
    def m(c: Curve) -> Curve:
        return _MemoCurve(c.xs, c.ys)

    return LatencyProfile(m(p.monolithic), m(p.chunked), m(p.decode), p.chunk_size, p.name)
