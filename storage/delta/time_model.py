"""Which way of sending a tensor reaches the receiver first: a plain-Python time model.

Bytes are not the goal, publish-to-applied time is. Per tensor of `n` dense bytes sent as
`method` with `coded` bytes on the wire, over a link of `gbps` with `cores` on each side:

    wire   = coded / bandwidth
    encode = (encode_fixed + n / encode_speed) / cores     (tensors are coded in a pool)
    apply  = (apply_fixed  + n / apply_speed)  / cores

The live path is not pipelined (encode, push, pull and apply follow each other per version),
so the time of a version is the SUM of the three over its tensors; that sum is additive per
tensor, so choosing per tensor is optimal for it. `pipelined_s` gives the issue's model for a
pipelined path, max(wire, encode, apply) summed over the version, which bench/transfer.py
reports next to the measured time.

"raw" is the tensor's bytes as they are (storage.weights.publisher.raw_encoder: no header, no
copy before the bucket, a view on the receiver): dense at its cheapest. Speeds are GB/s of
dense bytes on one core, measured on this project's 2-core CPU machine (bf16 4096 x 4096
AdamW deltas at lr 1e-6 and 1e-5, one thread: bench/transfer_calibrate.py) and rounded
down; the fixed costs are a 896-element tensor's encode/apply (header, checksums, sampling,
scan). Two threads measured 1.6-1.9x one thread's encode (numpy and zstd release the GIL).
"""
from __future__ import annotations

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
    "raw": Cost(4.0, 8.0, 5e-6, 5e-6),  # bucket copy + checksums; a view and a digest
    "dense": Cost(0.75, 1.0, 15e-6, 10e-6),
    "ef": Cost(0.75, 1.0, 80e-6, 60e-6),
    "ternary": Cost(0.95, 1.1, 80e-6, 60e-6),
    "xor_zstd": Cost(0.6, 0.8, 80e-6, 60e-6),
    "coo": Cost(1.0, 2.0, 80e-6, 60e-6),
}
# Before scanning a tensor its best encoding is unknown: the typical sparse one (Elias-Fano or
# ternary, what the chooser picks on AdamW deltas) with nothing on the wire bounds what coding
# could achieve. If raw beats even that, the scan is skipped.
CODED_FLOOR = Cost(0.8, 1.1, 80e-6, 60e-6)


@dataclass(frozen=True)
class Link:
    """The publish path's resources: link rate and cores on each side."""

    gbps: float
    cores: int = 1

    def __post_init__(self) -> None:
        if not self.gbps > 0:
            raise ValueError(f"link rate must be > 0 Gbps, got {self.gbps}")
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, got {self.cores}")

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * GBPS


def stages_s(cost: Cost, dense_bytes: int, coded_bytes: int,
             link: Link) -> tuple[float, float, float]:
    """(wire, encode, apply) seconds of one tensor, encode and apply shared over the cores."""
    wire = coded_bytes / link.bytes_per_s
    encode = (cost.encode_fixed_s + dense_bytes / (cost.encode_gbps * 1e9)) / link.cores
    apply = (cost.apply_fixed_s + dense_bytes / (cost.apply_gbps * 1e9)) / link.cores
    return wire, encode, apply


def tensor_s(method: str, dense_bytes: int, coded_bytes: int, link: Link) -> float:
    """Predicted seconds `method` adds to a (sequential) publish-to-applied."""
    return sum(stages_s(COSTS[method], dense_bytes, coded_bytes, link))


def raw_before_scan(dense_bytes: int, link: Link) -> bool:
    """True when sending the tensor raw beats any coding of it, even one of zero bytes: the
    change scan is not worth starting (tiny tensors, fast links)."""
    floor = sum(stages_s(CODED_FLOOR, dense_bytes, 0, link))
    return tensor_s("raw", dense_bytes, dense_bytes, link) <= floor


def raw_after_encode(method: str, dense_bytes: int, coded_bytes: int, link: Link) -> bool:
    """Once encoded (its encode time spent), whether raw still reaches the receiver first:
    compare what is left, wire + apply, against raw's wire + apply (+ its cheap encode)."""
    wire, _, apply = stages_s(COSTS[method], dense_bytes, coded_bytes, link)
    return tensor_s("raw", dense_bytes, dense_bytes, link) < wire + apply


def pipelined_s(wire_bytes: int, encode_cpu_s: float, apply_cpu_s: float, link: Link) -> float:
    """The issue's model of a pipelined publish: the slowest of link, encoders and appliers,
    max(coded bytes / bandwidth, encode CPU s / cores, apply CPU s / cores)."""
    return max(wire_bytes / link.bytes_per_s, encode_cpu_s / link.cores,
               apply_cpu_s / link.cores)
