"""A tensor-parallel engine's latency profile, derived from a measured single-device one.

The paper runs Qwen3-32B rollouts at TP 4 (§6: 'Rollout TP is 1 (8B) and 4 (32B)'); only
single-device profiles were measured here (sim/profiles/h100_qwen3_32b.json). A TP-t engine
(Megatron-style sharding, as vLLM's) splits each layer's matrix multiplies and attention heads t
ways and joins the partial outputs with two all-reduces per layer (after the attention output
projection and after the MLP down projection), each of the step's activations, tokens x hidden
x 2 bytes (bf16). So every curve point becomes

    y / t  +  2 x layers x allreduce(tokens)

tokens: the prompt length of a prefill, the batch of a decode step (one new token each). y / t
is the ideal split (no engine step gets faster than that; fixed per-step overheads that do not
shrink make the real one slower). A ring all-reduce sends 2 (t - 1) / t of the message over each
GPU's link, at the published NVLink bandwidth per direction (half the datasheet's bidirectional
figure), plus a fixed latency per all-reduce (a chosen parameter: its source says so).

A profile file may name such a derivation instead of measured curves ("tp_of": the measured
profile, "tp", "shape", "nvlink_gb_s", "allreduce_latency_s", "source"); sim/profiles.py's
load_profile derives it on every load, so no derived number is stored to go stale.
"""
from __future__ import annotations

from dataclasses import dataclass

from executors.policies.latency_profile import Curve, LatencyProfile

BYTES = 2  # bf16 activations
ALLREDUCES_PER_LAYER = 2  # attention output and MLP output (Megatron-LM's tensor parallelism)


@dataclass(frozen=True)
class TPSharding:
    tp: int
    layers: int
    hidden: int
    nvlink_gb_s: float  # the datasheet's bidirectional NVLink bandwidth per GPU (GB/s)
    allreduce_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.tp < 1 or self.layers < 1 or self.hidden < 1:
            raise ValueError("tp, layers and hidden must be >= 1")
        if not self.nvlink_gb_s > 0 or self.allreduce_latency_s < 0:
            raise ValueError("nvlink_gb_s must be > 0 and allreduce_latency_s >= 0")

    def allreduce_s(self, tokens: float) -> float:
        """Seconds of one ring all-reduce of `tokens` tokens' activations (0 at TP 1)."""
        if self.tp == 1:
            return 0.0
        per_direction = self.nvlink_gb_s * 1e9 / 2
        return self.allreduce_latency_s + 2 * (self.tp - 1) / self.tp * tokens * self.hidden * BYTES / per_direction

    def comm_s(self, tokens: float) -> float:
        """Seconds of all the all-reduces of one forward over `tokens` tokens."""
        return ALLREDUCES_PER_LAYER * self.layers * self.allreduce_s(tokens)

    def shard(self, profile: LatencyProfile) -> LatencyProfile:
        """`profile`'s engine at this TP degree: compute / tp plus the forward's all-reduces."""
        def curve(c: Curve) -> Curve:
            return Curve(c.xs, tuple(y / self.tp + self.comm_s(x) for x, y in zip(c.xs, c.ys)))

        return LatencyProfile(curve(profile.monolithic), curve(profile.chunked), curve(profile.decode),
                              profile.chunk_size, f"{profile.name} TP{self.tp}")
