"""This host's codec speed against the time model's (storage/delta/time_model.py COSTS).

COSTS were fitted on one 2-core VM on one day. A trainer's host may be several times faster or
slower, and even that VM's speed drifts 1.5-2.6x between days (bench/results/
transfer_calibrate.json against COSTS). The publisher chooses each tensor's form by time, so
a stale CPU cost misleads it as a stale link rate does: on a faster host coding is cheaper
than the model says, and raw wins where it should not. `probe()` times the codec itself on
synthetic bf16 deltas shaped to land in each costed regime (weights ~N(0, 0.02) each moved
by a Gaussian step: Elias-Fano where ~3% of them changed, ternary where ~30% did, ternary over
nearly all where ~96% did, the demo's own regime), and raw's trip through fresh bucket memory
(40 MB: the allocator maps it anew, so its pages fault in as a bucket's do) with two hashes,
best of `repeat` each, and gives per method the model's seconds over the measured ones (above
1: this host is faster), for encode and for apply. A coding it does not probe takes the median
of those it did (raw aside: its cost is memory, not coding). The receivers' apply speed is
taken to be the trainer host's: the publisher has no other measure of it. About 0.15-0.5 s on
this VM, once per process (`measured()`).
"""
from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import numpy as np
import torch
import xxhash

from storage.delta import kernels, time_model
from storage.delta.apply import apply_delta
from storage.delta.payload import coded_as, encode_delta, read_header

PROBE_ELEMENTS = 1 << 20  # 2 MB of bf16: fixed costs a small part; 8 MB gives the same factors
STEPS = {"ef": 3e-6, "ternary": 3e-5, "ternary_dense": 1e-3}  # method: the step's std
RAW_PROBE_BYTES = 40 << 20  # above glibc's largest mmap threshold (32 MB): fresh pages
CLAMP = (0.1, 10.0)  # a factor beyond these is a hiccup (a preempted probe), not the host

_lock = threading.Lock()
_result: time_model.HostSpeed | None = None


def best_seconds(fn: Callable[[], object], repeat: int = 3) -> float:
    """The fastest of `repeat` runs of `fn`: the least disturbed one on a shared host."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def apply_in_place_seconds(payload: bytes, base: torch.Tensor, repeat: int = 3) -> float:
    """The fastest of `repeat` in-place applies of `payload`, as receivers apply (into the held
    tensor: no fresh memory), each onto a copy of `base` made before its timing."""
    best = float("inf")
    for _ in range(repeat):
        held = base.clone()
        t = time.perf_counter()
        apply_delta(payload, held, base_version=0, in_place=True)
        best = min(best, time.perf_counter() - t)
    return best


def raw_trip_seconds(nbytes: int, repeat: int = 3) -> float:
    """A raw tensor's cost on one side, beyond the wire (the fastest of `repeat`): its bytes
    copied into fresh memory (the sender's bucket; the receiver's lands in fresh memory too,
    every page faulting in) and hashed twice (the bucket's checksum, the tensor's digest)."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)

    def trip() -> None:
        bucket = np.empty_like(src)  # fresh memory each time, as a bucket's
        np.copyto(bucket, src)
        xxhash.xxh3_64_intdigest(bucket)
        xxhash.xxh3_64_intdigest(bucket)
    return best_seconds(trip, repeat)


def _versions(step: float, numel: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(base, new): bf16 weights ~N(0, 0.02), and them after a Gaussian step of std `step`."""
    rng = np.random.default_rng(seed)
    weights = torch.from_numpy(rng.standard_normal(numel, dtype=np.float32) * 0.02)
    moved = weights + torch.from_numpy(rng.standard_normal(numel, dtype=np.float32) * step)
    return weights.bfloat16(), moved.bfloat16()


def _coded_method(payload: bytes, numel: int) -> str:
    """The COSTS entry a payload's encoding is costed by (time_model.raw_after_encode's rule
    for ternary bodies of many bits per element)."""
    method = coded_as(payload, read_header(payload))
    if method == "ternary" and len(payload) * 8 >= time_model.DENSE_CHANGE_BITS * numel:
        return "ternary_dense"
    return method


def _coded_factors(step: float, numel: int, repeat: int) -> tuple[str, float, float]:
    """(the method the step's delta is costed by, encode factor, apply factor)."""
    base, new = _versions(step, numel, seed=0)
    payload = encode_delta(new, base, name="probe", base_version=0, target_version=1)
    method = _coded_method(payload, numel)
    encode_s = best_seconds(lambda: encode_delta(new, base, name="probe", base_version=0,
                                          target_version=1), repeat)
    apply_s = apply_in_place_seconds(payload, base, repeat)
    cost = time_model.COSTS[method]
    nbytes = numel * 2
    return (method, (cost.encode_fixed_s + nbytes / (cost.encode_gbps * 1e9)) / encode_s,
            (cost.apply_fixed_s + nbytes / (cost.apply_gbps * 1e9)) / apply_s)


def _raw_factor(nbytes: int, repeat: int) -> float:
    cost = time_model.COSTS["raw"]
    return (cost.encode_fixed_s + nbytes / (cost.encode_gbps * 1e9)) / raw_trip_seconds(nbytes,
                                                                                      repeat)


def probe(repeat: int = 3, numel: int = PROBE_ELEMENTS) -> time_model.HostSpeed:
    """This host's speed per method against COSTS (see the module docstring)."""
    if repeat < 1 or numel < 1024:
        raise ValueError(f"a probe needs repeat >= 1 and numel >= 1024, got {repeat}, {numel}")
    kernels.warm_up()  # compiling is not coding: time only warm kernels
    factors: dict[str, tuple[float, float]] = {}
    for step in STEPS.values():
        method, enc, app = _coded_factors(step, numel, repeat)
        factors[method] = (enc, app)  # (keyed by what it coded as: a codec that changed wins)
    # a coding method not probed (coo, xor_zstd, dense) runs as the probed codings do
    rest = (statistics.median(f[0] for f in factors.values()),
            statistics.median(f[1] for f in factors.values()))
    raw = _raw_factor(RAW_PROBE_BYTES, repeat)  # memory, not coding: a factor of its own
    factors["raw"] = (raw, raw)
    lo, hi = CLAMP
    every = {m: factors.get(m, rest) for m in time_model.COSTS}
    return time_model.HostSpeed(tuple(sorted(
        (m, min(max(e, lo), hi), min(max(a, lo), hi)) for m, (e, a) in every.items())))


def measured() -> time_model.HostSpeed:
    """This process's probe(), taken on first use (the first delta a publisher chooses by
    time: the codec is idle then, where a probe beside a full snapshot's push would time the
    contention) and kept: the host does not change under a process."""
    global _result
    with _lock:
        if _result is None:
            _result = probe()
        return _result
