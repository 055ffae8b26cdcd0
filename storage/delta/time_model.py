"""Which way of sending a tensor reaches the receiver first: a plain-Python time model.

Bytes are not the goal, publish-to-applied time is. Per tensor of `n` dense bytes sent as
`method` with `coded` bytes on the wire, over a link of `gbps` with `cores` on each side:

    wire   = coded / bandwidth
    encode = (encode_fixed + n / encode_speed) / cores     (tensors are coded in a pool)
    apply  = (apply_fixed  + n / apply_speed)  / cores

The live path overlaps the two sides only bucket by bucket (a streamed delta is applied
while its next bucket is encoded: storage/weights/stream_pull.py), and on a small machine
both sides share the same cores, so the chooser takes the SUM of the three per tensor (what a
tensor adds when the stages do not overlap): additive per tensor, so choosing per tensor is
optimal for it. `pipelined_s` gives the issue's model of a fully pipelined path, the largest
of the three each summed over the version, which bench/transfer/transfer.py reports next to the
measured time.

"raw" is the tensor's bytes as they are (storage.weights.payloads.raw_encoder: no header, no
copy before the bucket, a view on the receiver): dense at its cheapest. Speeds are GB/s of
dense bytes on one core, fixed costs per tensor, fitted on this project's 2-core CPU machine
(bench/transfer/transfer_calibrate.py: the demo policy's tensors and 64 KB-8 MB AdamW deltas at lr
1e-6 to 5e-4, one thread, applied in place as receivers do; raw as its bytes' trip through
fresh bucket memory and two hashes on each side) and rounded to the slow side. Two threads
encode 1.7x as fast as one (bench/results/transfer_calibrate.json), but a model that fits in
one pool task is coded on one (the publisher's Link says so). Coding costs depend on how many
elements moved: Elias-Fano where few did, ternary where more did, and ternary where nearly
all did is ~2x slower again, so before the scan a sampled density picks the cost and
estimates the coded size. A Link's `speed` scales these costs to the host that runs them
(HostSpeed, probed by storage/delta/host_speed.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

GBPS = 1e9 / 8  # bytes per second in one Gbit/s


@dataclass(frozen=True)
class Cost:
    """One method's CPU cost on one core."""

    encode_gbps: float  # GB/s of dense bytes
    apply_gbps: float
    encode_fixed_s: float  # per tensor, whatever its size
    apply_fixed_s: float


COSTS: dict[str, Cost] = {
    # raw: a fresh bucket and two hashes on each side (fit 1.78 GB/s: fresh memory faults in)
    "raw": Cost(1.8, 1.8, 5e-6, 5e-6),
    "dense": Cost(0.75, 1.0, 15e-6, 10e-6),
    # fits over three runs (the scan and apply kernels of 2026-11-26): encode 51-96 us +
    # 1.62-1.98 GB/s, apply in place 38-65 us + 2.64-3.41 GB/s; medians, to the slow side
    "ef": Cost(1.9, 2.6, 70e-6, 50e-6),
    # ternary where 10-25% moved (fit 257 us + 0.45 GB/s, apply 56 us + 0.50), and where
    # nearly all did (fit 249 us + 0.22 GB/s, apply ~0.21-0.25 GB/s): compiled symbol passes
    # (storage/delta/ternary_kernels.py), no change scan below 512k elements; most of the
    # fixed cost is zstd-1 (~70 us per 12 KB frame on this machine)
    "ternary": Cost(0.45, 0.5, 250e-6, 55e-6),
    "ternary_dense": Cost(0.22, 0.25, 250e-6, 50e-6),
    "xor_zstd": Cost(0.5, 0.6, 80e-6, 60e-6),
    "coo": Cost(1.0, 2.0, 40e-6, 20e-6),
}
TERNARY_DENSITY = 0.15  # the chooser's switch (payload.py) from Elias-Fano to ternary
DENSE_CHANGE = 0.5  # above it, ternary's escapes dominate: "ternary_dense" costs
DENSE_CHANGE_BITS = 3.0  # a ternary body above this many bits per element: the same regime
VALUE_BITS = 5.5  # coded bits per changed value (values.py on AdamW deltas: 4-6)


def coded_estimate(density: float, dense_bytes: int, itemsize: int) -> tuple[str, int]:
    """(likely encoding, its size) at `density` before any scan: n H(density) bits for the
    positions plus VALUE_BITS per change, what both Elias-Fano and ternary come close to."""
    d = min(max(density, 0.0), 1.0)
    h = 0.0 if d in (0.0, 1.0) else -(d * math.log2(d) + (1 - d) * math.log2(1 - d))
    method = "ef" if d < TERNARY_DENSITY else "ternary" if d < DENSE_CHANGE else "ternary_dense"
    return method, int(dense_bytes * (h + VALUE_BITS * d) / (8 * itemsize))


@dataclass(frozen=True)
class HostSpeed:
    """How much faster than COSTS this host codes, per method: (method, encode factor, apply
    factor) triples, measured by storage/delta/host_speed.py; a method absent runs at COSTS.
    A tuple, so a Link holding it stays hashable (the choosers cache by link)."""

    factors: tuple[tuple[str, float, float], ...] = ()

    def __post_init__(self) -> None:
        for method, enc, app in self.factors:
            if method not in COSTS:
                raise ValueError(f"no cost for method {method!r}; known: {sorted(COSTS)}")
            if not (enc > 0 and app > 0):
                raise ValueError(f"{method}: speed factors must be > 0, got {enc}, {app}")

    def cost(self, method: str) -> Cost:
        """COSTS[method] at this host's speed."""
        cost = COSTS[method]
        for name, enc, app in self.factors:
            if name == method:
                return Cost(cost.encode_gbps * enc, cost.apply_gbps * app,
                            cost.encode_fixed_s / enc, cost.apply_fixed_s / app)
        return cost

    def as_dict(self) -> dict[str, list[float]] | None:
        """method -> [encode factor, apply factor]; None when not measured (COSTS as fitted)."""
        return {m: [enc, app] for m, enc, app in self.factors} or None


@dataclass(frozen=True)
class Link:
    """The publish path's resources: link rate, cores on each side (the cores the coding
    keeps busy: one for a model that fits in one pool task, storage/weights/parallel.py) and
    their speed against COSTS (`speed`; COSTS as fitted when not measured)."""

    gbps: float
    cores: int = 1
    speed: HostSpeed = HostSpeed()

    def __post_init__(self) -> None:
        if not self.gbps > 0:
            raise ValueError(f"link rate must be > 0 Gbps, got {self.gbps}")
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, got {self.cores}")

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * GBPS

    def cost(self, method: str) -> Cost:
        return self.speed.cost(method)


def stages_s(cost: Cost, dense_bytes: int, coded_bytes: int,
             link: Link) -> tuple[float, float, float]:
    """(wire, encode, apply) seconds of one tensor, encode and apply shared over the cores."""
    wire = coded_bytes / link.bytes_per_s
    encode = (cost.encode_fixed_s + dense_bytes / (cost.encode_gbps * 1e9)) / link.cores
    apply = (cost.apply_fixed_s + dense_bytes / (cost.apply_gbps * 1e9)) / link.cores
    return wire, encode, apply


def tensor_s(method: str, dense_bytes: int, coded_bytes: int, link: Link) -> float:
    """Predicted seconds `method` adds to a (sequential) publish-to-applied."""
    return sum(stages_s(link.cost(method), dense_bytes, coded_bytes, link))


def _raw_and_free_s(dense_bytes: int, link: Link) -> tuple[float, float]:
    """(raw's time, an empty coding's time)."""
    return tensor_s("raw", dense_bytes, dense_bytes, link), tensor_s("ef", dense_bytes, 0, link)


# Sampling a tensor's density (storage/weights/tensor_form._verdict: both versions' bits and
# bits.estimated_density, every element of a small tensor, 16 windows of a large one) costs
# time too: ~20 us plus ~0.17 ns per byte compared on this machine (4k elements 20 us, 32k
# 26 us, 256k 77 us, 16 windows of 8k 67-69 us)
SAMPLE_FIXED_S = 20e-6
SAMPLE_GBPS = 6.0  # GB/s of bf16 bytes compared


def sample_s(compared_bytes: int) -> float:
    """Predicted seconds of a density sample over `compared_bytes` of each version."""
    return SAMPLE_FIXED_S + compared_bytes / (SAMPLE_GBPS * 1e9)


def worth_sampling(dense_bytes: int, compared_bytes: int, link: Link,
                   odds: float = 0.5) -> bool:
    """Whether sampling the density is expected to pay: the most coding could save over raw
    (coding nothing, for free), at `odds` that the sample finds coding worth it (even when
    nothing is known of the density before), against the sample's cost. A mid-sized tensor
    on a fast link goes raw unseen."""
    raw, free = _raw_and_free_s(dense_bytes, link)
    return odds * (raw - free) > sample_s(compared_bytes)


def raw_before_scan(dense_bytes: int, itemsize: int, density: float, link: Link) -> bool:
    """True when sending the tensor raw is predicted to beat coding it (tiny tensors, fast
    links, most elements moved): the change scan is then not worth starting."""
    raw, free = _raw_and_free_s(dense_bytes, link)
    if raw <= free:  # beats even a free, empty coding
        return True
    method, coded = coded_estimate(density, dense_bytes, itemsize)
    return raw <= tensor_s(method, dense_bytes, coded, link)


def raw_after_encode(method: str, dense_bytes: int, coded_bytes: int, itemsize: int,
                     link: Link) -> bool:
    """Once encoded (its encode time spent), whether raw still reaches the receiver first:
    compare what is left, wire + apply, against raw's wire + apply (+ its cheap encode)."""
    if method == "ternary" and coded_bytes * 8 * itemsize >= DENSE_CHANGE_BITS * dense_bytes:
        method = "ternary_dense"
    wire, _, apply = stages_s(link.cost(method), dense_bytes, coded_bytes, link)
    return tensor_s("raw", dense_bytes, dense_bytes, link) < wire + apply


def pipelined_s(wire_bytes: int, encode_cpu_s: float, apply_cpu_s: float, link: Link) -> float:
    """The issue's model of a pipelined publish: the slowest of link, encoders and appliers,
    max(coded bytes / bandwidth, encode CPU s / cores, apply CPU s / cores)."""
    return max(wire_bytes / link.bytes_per_s, encode_cpu_s / link.cores,
               apply_cpu_s / link.cores)
