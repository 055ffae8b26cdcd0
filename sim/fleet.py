"""A GPU fleet for the simulator: the measured profiles its engines run, and what follows from
the models' shapes and the device (KV pool, train and publish seconds, serving load).

sim/profiles/fleet_<name>.json names two measured profiles (sim/profiles/<kind>_<model>.json),
the two architectures (sim/profiles/shapes/) and the device's memory; everything else is
derived here, and each derivation is returned beside the settings so a report can print it:
- KV pool: what vLLM's default 0.9 of device memory leaves after both models' bf16 weights,
  in 32-token blocks of the larger per-token KV of the two models;
- train seconds per token: measured by bench/train_profile.py where
  sim/profiles/<rollout_profile>_train.json exists, else 3x the measured forward time per
  token at the longest profiled prompt (backward is twice the forward's matrix work); per
  trainer GPU, data parallel;
- publish seconds: the dense bf16 weights over the link (no codec gain assumed);
- serving rate: the trace speed-up at which one serving GPU, serving requests one at a time,
  is busy `serving_utilization` of the time (default 18.9%: the paper's measured mean SM
  utilization of a serving fleet).
A fleet of tensor-parallel engines (`tp` > 1, the paper's 32B at TP 4) simulates each engine as
one device: its profiles are TP-sharded (sim/tp_profile.py), its memory and HBM bandwidth are
`tp` GPUs' (each GPU holds 1/tp of the weights and of every token's KV, and reads its own share),
and its training time comes from the single-GPU `train_profile`.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import lru_cache

from sim.engine_cost import ContextCost
from sim.profiles import PROFILE_DIR, load_profile
from sim.serving import BLOCK
from sim.train_parallel import TrainParallelism
from sim.workload import trace_requests

SHAPES = PROFILE_DIR / "shapes"
BYTES = 2  # bf16


@dataclass(frozen=True)
class FleetSpec:
    rollout_profile: str
    serving_profile: str
    rollout_shape: str
    serving_shape: str
    gpu_memory_gb: float
    memory_utilization: float = 0.9
    serving_utilization: float = 0.189
    link_gbps: float = 200.0
    serving_max_len: int = 8192
    # the device's published HBM bandwidth (TB/s), for what long contexts cost (sim/engine_cost.py)
    memory_bandwidth_tb_s: float | None = None
    bandwidth_source: str = ""
    tp: int = 1  # GPUs per engine; gpu_memory_gb and memory_bandwidth_tb_s stay one GPU's
    train_profile: str | None = None  # <name>_train.json's name (None: the rollout profile's)
    # the trainer's (TP, PP, CP) and links: {"tp", "pp", "cp", "nvlink_gb_s", "ib_gb_s", "source"}
    # (sim/train_parallel.py); None: data parallel only, no communication charged
    train_parallelism: dict | None = None

    def __post_init__(self) -> None:
        for shape in (self.rollout_shape, self.serving_shape):
            if not (SHAPES / shape / "config.json").is_file():
                raise ValueError(f"no architecture {shape!r} in {SHAPES}")
        if not 0 < self.memory_utilization <= 1 or not 0 < self.serving_utilization < 1:
            raise ValueError("memory_utilization must be in (0, 1] and serving_utilization in (0, 1)")
        if self.gpu_memory_gb <= 0 or self.link_gbps <= 0 or self.serving_max_len < 2:
            raise ValueError("gpu_memory_gb and link_gbps must be > 0, serving_max_len >= 2")
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if self.memory_bandwidth_tb_s is not None and not self.memory_bandwidth_tb_s > 0:
            raise ValueError(f"memory_bandwidth_tb_s must be > 0, got {self.memory_bandwidth_tb_s}")
        if self.train_parallelism is not None:
            train_parallelism(self)  # its own checks, with the shape's layers


def train_parallelism(spec: FleetSpec) -> TrainParallelism | None:
    """The fleet's trainer parallelism on its trained (rollout) model's shape, if it names one."""
    if spec.train_parallelism is None:
        return None
    p = {k: v for k, v in spec.train_parallelism.items() if k != "source"}
    unknown = set(p) - {"tp", "pp", "cp", "nvlink_gb_s", "ib_gb_s", "gpus_per_node"}
    if unknown:
        raise ValueError(f"train_parallelism has unknown keys {sorted(unknown)}")
    c = _config(spec.rollout_shape)
    return TrainParallelism(**p, layers=c["num_hidden_layers"], hidden=c["hidden_size"], kv_width=_widths(c)[1])


def load_fleet(name: str) -> FleetSpec:
    path = PROFILE_DIR / f"fleet_{name}.json"
    if not path.is_file():
        known = sorted(p.stem.removeprefix("fleet_") for p in PROFILE_DIR.glob("fleet_*.json"))
        raise FileNotFoundError(f"no fleet {name!r} in {PROFILE_DIR}; shipped: {known}")
    d = json.loads(path.read_text())
    return FleetSpec(**{k: v for k, v in d.items() if k != "comment"})


def _config(shape: str) -> dict:
    return json.loads((SHAPES / shape / "config.json").read_text())


def _widths(c: dict) -> tuple[int, int]:
    """(query, key/value) projection widths: heads x head_dim."""
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim


def shape_numbers(shape: str) -> tuple[int, int]:
    """(parameters, KV bytes per token) of an architecture, from its config.json."""
    c = _config(shape)
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    q, kv = _widths(c)
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * c["intermediate_size"]
    embeddings = vocab * h * (1 if c.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings, layers * 2 * kv * BYTES


DEFAULT_RATE = 6.0  # trace speed-up per serving GPU of the CPU sweep (no fleet)


def sweep_settings(fleet: str | None, rate: float | None, rollout_profile: str = "cpu_policy",
                   serving_profile: str = "cpu_serving") -> dict:
    """SimConfig keyword arguments shared by a sweep's configurations: the fleet's (its derived
    serving rate unless `rate` is given), or the named profiles at `rate` (default 6)."""
    if fleet is None:
        return dict(rollout_profile=rollout_profile, serving_profile=serving_profile,
                    serving_rate=rate or DEFAULT_RATE)
    settings = dict(_fleet_settings_by_name(fleet)[0])
    if rate is not None:
        settings["serving_rate"] = rate
    return settings


@lru_cache(maxsize=None)
def _fleet_settings_by_name(name: str) -> tuple[dict, dict]:
    return fleet_settings(load_fleet(name))  # one derivation per fleet and process


def fleet_settings(spec: FleetSpec) -> tuple[dict, dict]:
    """SimConfig keyword arguments for this fleet, and how each was derived."""
    rollout, serving = load_profile(spec.rollout_profile), load_profile(spec.serving_profile)
    r_params, r_kv = shape_numbers(spec.rollout_shape)
    s_params, s_kv = shape_numbers(spec.serving_shape)
    memory = spec.tp * spec.gpu_memory_gb * 1e9 * spec.memory_utilization  # one engine's
    free = memory - BYTES * (r_params + s_params)
    if free <= 0:
        raise ValueError(f"{spec.rollout_shape} and {spec.serving_shape} do not fit in "
                         f"{spec.tp} x {spec.gpu_memory_gb} GB together")
    kv_blocks = int(free // (BLOCK * max(r_kv, s_kv)))
    train_file = PROFILE_DIR / f"{spec.train_profile or spec.rollout_profile}_train.json"
    if train_file.is_file():
        train_s_per_token = float(json.loads(train_file.read_text())["train_s_per_token"])
        train_how = f"measured: {train_file.name} = {train_s_per_token:.3g} s"
    else:
        longest = rollout.monolithic.xs[-1]
        train_s_per_token = 3 * rollout.prefill(int(longest)) / longest
        train_how = f"3 x P({int(longest)}) / {int(longest)} = {train_s_per_token:.3g} s"
    par = train_parallelism(spec)
    if par is not None:  # the splits' communication, per token and trainer GPU as the compute
        train_s_per_token += par.comm_s_per_token()
        train_how += (f" compute + (TP, PP, CP) = ({par.tp}, {par.pp}, {par.cp}) communication: TP all-reduces "
                      f"{par.tp_s_per_token():.3g} s + CP ring {par.cp_s_per_token():.3g} s = "
                      f"{train_s_per_token:.3g} s ({spec.train_parallelism.get('source', '')})")
    publish_s = BYTES * r_params / (spec.link_gbps * 1e9 / 8)
    prompts, outputs, span_s = trace_requests(spec.serving_max_len)
    busy = statistics.fmean(serving.prefill(p) + o * serving.decode_step(1) for p, o in zip(prompts, outputs))
    trace_rate = len(prompts) / span_s
    serving_rate = spec.serving_utilization / (busy * trace_rate)
    settings = dict(rollout_profile=spec.rollout_profile, serving_profile=spec.serving_profile,
                    kv_blocks=kv_blocks, train_s_per_token=train_s_per_token, publish_s=publish_s,
                    serving_rate=serving_rate, serving_length_scale=1.0,
                    serving_max_len=spec.serving_max_len)
    ctx = context_cost(spec)
    if ctx.active:
        settings.update(rollout_kv_s_per_token=ctx.kv_s_per_token, rollout_attn_s_per_pair=ctx.attn_s_per_pair,
                        rollout_kv_blocks=int((memory - BYTES * r_params) // (BLOCK * r_kv)))
    how = {"rollout_params": r_params, "serving_params": s_params,
           "kv_bytes_per_token": {"rollout": r_kv, "serving": s_kv},
           "kv_blocks": f"({spec.tp} x {spec.gpu_memory_gb} GB x {spec.memory_utilization} - bf16 weights) / "
                        f"({BLOCK} x {max(r_kv, s_kv)} B) = {kv_blocks}",
           "train_s_per_token": train_how,
           "publish_s": f"{BYTES * r_params / 1e9:.1f} GB at {spec.link_gbps:g} Gbps = {publish_s:.2f} s",
           "serving_rate": (f"{spec.serving_utilization:.1%} busy / ({busy:.3f} s per request alone x "
                            f"{trace_rate:.2f} req/s of the trace) = x{serving_rate:.3f}"),
           "context_cost": ctx.source}
    return settings, how


def context_cost(spec: FleetSpec) -> ContextCost:
    """The rollout model's long-context terms on this fleet's device (none without a bandwidth)."""
    if spec.memory_bandwidth_tb_s is None:
        return ContextCost.none()
    c = _config(spec.rollout_shape)
    params, kv = shape_numbers(spec.rollout_shape)
    # an engine's profile already runs at its TP degree; its KV reads spread over tp GPUs' bandwidth
    return ContextCost.derive(load_profile(spec.rollout_profile), params, c["num_hidden_layers"], _widths(c)[0],
                              kv, spec.tp * spec.memory_bandwidth_tb_s,
                              f"{spec.tp} x " * (spec.tp > 1) + spec.bandwidth_source)
