"""A device's latency profile derived from one measured on another device, by roofline scaling.

No H20 or H800 was lent to measure on, so their profiles come from the measured H100 one
(sim/profiles/h100_*.json) and the devices' published specifications. Each sample point of
the measured curves is a step whose FLOPs and HBM bytes follow from the model's shape:
- a prefill of L tokens (nothing cached): 2 P L FLOPs of weights plus causal attention,
  2 layers q L^2 (half of QK^T and AV's 4 layers q L^2); it reads the bf16 weights once and
  writes L tokens of KV;
- a decode step of B requests at the profile's 512 tokens of context each: 2 P B FLOPs plus
  4 layers q B 512 of attention; it reads the weights and the B x 512 tokens of KV.
The step's time on the target device is its measured time x roofline(target) / roofline(measured),
roofline = max(FLOPs / peak dense FLOP/s, bytes / HBM bandwidth): whichever bound a step is
under moves it, and its measured overheads (launches, non-matmul kernels) move with that bound
(an assumption: the one way the specifications allow without a measurement on the device).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from executors.policies.latency_profile import Curve, LatencyProfile
from sim.engine_cost import REFERENCE_CONTEXT
from sim.fleet import SHAPES, shape_numbers

BYTES = 2  # bf16


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    tflops: float  # dense BF16 tensor-core TFLOP/s (the datasheets' sparse figures halved)
    hbm_tb_s: float
    memory_gb: float
    cost: float  # per-GPU cost, normalized to the H20 (RollArt Table 2)
    source: str

    def roofline_s(self, flops: float, hbm_bytes: float) -> float:
        return max(flops / (self.tflops * 1e12), hbm_bytes / (self.hbm_tb_s * 1e12))


# NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 1,979 TFLOPS with sparsity (989 dense),
# 80 GB HBM3 at 3.35 TB/s. The H800 SXM is the H100 SXM chip and memory system with NVLink cut
# to 400 GB/s (RollArt Table 2: 989.5 TFLOPS, 80 GB, 3.35 TB/s, cost 2.85 x the H20's).
H100_SXM = DeviceSpec("H100", 989.0, 3.35, 80.0, 2.85,
                      "NVIDIA H100 datasheet (SXM): 989 dense BF16 TFLOPS, 80 GB HBM3, 3.35 TB/s")
H800 = DeviceSpec("H800", 989.0, 3.35, 80.0, 2.85,
                  "the H100 SXM's compute and HBM (NVLink 400 GB/s); RollArt Table 2: 989.5 TFLOPS, "
                  "3.35 TB/s, normalized cost 2.85")
# NVIDIA HGX H20 specifications: 148 dense BF16 TFLOPS, 96 GB HBM3 at 4.0 TB/s (RollArt Table 2
# lists the same, normalized cost 1.00).
H20 = DeviceSpec("H20", 148.0, 4.0, 96.0, 1.00,
                 "NVIDIA HGX H20 specifications: 148 dense BF16 TFLOPS, 96 GB HBM3, 4.0 TB/s; "
                 "RollArt Table 2: normalized cost 1.00")


@dataclass(frozen=True)
class ModelShape:
    params: int
    layers: int
    q_dim: int  # attention heads x head dim
    kv_bytes_per_token: int

    @classmethod
    def of(cls, shape: str) -> "ModelShape":
        """An architecture of sim/profiles/shapes/ by name, e.g. "qwen3-8b"."""
        c = json.loads((SHAPES / shape / "config.json").read_text())
        params, kv = shape_numbers(shape)
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        return cls(params, c["num_hidden_layers"], c["num_attention_heads"] * head_dim, kv)

    def prefill(self, tokens: float) -> tuple[float, float]:
        """(FLOPs, HBM bytes) of a prefill of `tokens` with nothing cached."""
        flops = 2 * self.params * tokens + 2 * self.layers * self.q_dim * tokens * tokens
        return flops, BYTES * self.params + tokens * self.kv_bytes_per_token

    def decode(self, batch: float, context: int = REFERENCE_CONTEXT) -> tuple[float, float]:
        """(FLOPs, HBM bytes) of one decode step of `batch` requests at `context` tokens each."""
        flops = 2 * self.params * batch + 4 * self.layers * self.q_dim * batch * context
        return flops, BYTES * self.params + batch * context * self.kv_bytes_per_token


def scale_profile(profile: LatencyProfile, shape: ModelShape, measured_on: DeviceSpec,
                  target: DeviceSpec) -> LatencyProfile:
    """`profile` (measured on `measured_on`) as it would time on `target`, point by point."""

    def scaled(curve: Curve, work) -> Curve:
        return Curve(curve.xs, tuple(y * target.roofline_s(*work(x)) / measured_on.roofline_s(*work(x))
                                     for x, y in zip(curve.xs, curve.ys)))

    return LatencyProfile(scaled(profile.monolithic, shape.prefill), scaled(profile.chunked, shape.prefill),
                          scaled(profile.decode, shape.decode), profile.chunk_size,
                          f"{profile.name} on {target.name} (roofline from {measured_on.name})")


def speedups(shape: ModelShape, a: DeviceSpec, b: DeviceSpec) -> dict[str, float]:
    """b's time over a's on a few reference steps: how the scaling moves each kind of step."""
    steps = {"prefill 16": shape.prefill(16), "prefill 512": shape.prefill(512),
             "prefill 8192": shape.prefill(8192), "decode B=1": shape.decode(1),
             "decode B=16": shape.decode(16), "decode B=64": shape.decode(64)}
    return {k: b.roofline_s(*w) / a.roofline_s(*w) for k, w in steps.items()}
