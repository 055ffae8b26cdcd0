"""Tensors as flat arrays of bit patterns.

Every supported dtype is coded through the unsigned integer of its width (bf16 -> uint16), so
"changed" means "some bit differs" (NaN payloads, -0 vs +0 count) and decoding is bit-exact.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from storage.delta import kernels, probe_kernels

# Stable on-the-wire codes: never renumber, only append.
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.bfloat16: 1, torch.float16: 2, torch.float32: 3, torch.float64: 4,
    torch.uint8: 5, torch.int8: 6, torch.int16: 7, torch.int32: 8, torch.int64: 9,
    torch.bool: 10, torch.uint16: 11, torch.uint32: 12, torch.uint64: 13,
}
for _code, _name in ((14, "float8_e4m3fn"), (15, "float8_e5m2")):
    if hasattr(torch, _name):
        DTYPE_CODES[getattr(torch, _name)] = _code
DTYPES_BY_CODE: dict[int, torch.dtype] = {code: dt for dt, code in DTYPE_CODES.items()}

# torch can view any dtype as the signed int of its width; numpy then reinterprets as unsigned.
_TORCH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NP_UINT = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_NP_INT = {1: np.dtype("u1"), 2: np.dtype("<i2"), 4: np.dtype("<i4"), 8: np.dtype("<i8")}

# Samples: evenly spaced windows, for density estimates without a full pass.
SAMPLE_WINDOWS, SAMPLE_WINDOW = 16, 8192


def check_dtype(dtype: torch.dtype) -> None:
    if dtype not in DTYPE_CODES:
        raise TypeError(f"delta codec does not support dtype {dtype}")


def uint_dtype(dtype: torch.dtype) -> np.dtype:
    """The unsigned numpy dtype that carries `dtype`'s bit patterns."""
    check_dtype(dtype)
    return _NP_UINT[dtype.itemsize]


def to_bits(t: torch.Tensor) -> np.ndarray:
    """Flat unsigned view of a tensor's bits (shares memory when already contiguous on CPU)."""
    check_dtype(t.dtype)
    size = t.dtype.itemsize
    if not t.is_cpu or not t.is_contiguous():
        t = t.to("cpu").contiguous()
    if t.requires_grad:
        t = t.detach()
    # one view chain, no copies: this runs per tensor per publish (and per density sample)
    return t.view(_TORCH_INT[size]).numpy().reshape(-1).view(_NP_UINT[size])


def from_bits(u: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Tensor of `dtype` and `shape` whose bits are `u` (takes ownership of `u`)."""
    if not (u.flags.c_contiguous and u.flags.writeable):
        u = u.copy()
    signed = torch.from_numpy(u.view(_NP_INT[dtype.itemsize]))
    return signed.view(dtype).reshape(shape)


@dataclass
class Changes:
    """Where new differs from base, and by how much."""
    positions: np.ndarray  # sorted int64
    diff: np.ndarray       # new[positions] - base[positions], wrapping, unsigned


@functools.lru_cache(maxsize=256)
def _window_stride(n: int, window: int) -> int | None:
    """Elements between the starts of evenly spaced sample windows, or None when n is small
    enough to look at it all (the windows then could not be 4x apart)."""
    if n < 4 * window * SAMPLE_WINDOWS:
        return None
    return (n - window) // (SAMPLE_WINDOWS - 1)


def sample_rows(a: np.ndarray, window: int = SAMPLE_WINDOW) -> np.ndarray | None:
    """Evenly spaced windows of `window` elements of a flat array, as the rows of one
    read-only strided view (one numpy op compares them all), or None when it is small enough
    to look at it all (under 4x the windows' elements)."""
    stride = _window_stride(a.size, window)
    if stride is None:
        return None
    return np.lib.stride_tricks.as_strided(a, (SAMPLE_WINDOWS, window),
                                           (stride * a.itemsize, a.itemsize), writeable=False)


def sampled_elements(n: int) -> int:
    """How many elements estimated_density compares in a tensor of n."""
    return n if _window_stride(n, SAMPLE_WINDOW) is None else SAMPLE_WINDOWS * SAMPLE_WINDOW


def sampled_density(new: np.ndarray, base: np.ndarray) -> float | None:
    """Estimated fraction of changed elements, or None when the tensor is too small to sample."""
    stride = _window_stride(new.size, SAMPLE_WINDOW)
    if stride is None:
        return None
    changed = probe_kernels.window_changes(new, base, stride, SAMPLE_WINDOW, SAMPLE_WINDOWS)
    return changed / (SAMPLE_WINDOW * SAMPLE_WINDOWS)


def estimated_density(new: np.ndarray, base: np.ndarray) -> float:
    """sampled_density, or the exact fraction where the tensor is small enough to look at."""
    sampled = sampled_density(new, base)
    if sampled is not None:
        return sampled
    return int(np.count_nonzero(new != base)) / new.size if new.size else 0.0


def changes(new: np.ndarray, base: np.ndarray, density: float | None = None,
            reuse: bool = False) -> Changes:
    """Every element whose bit pattern differs, with its difference (one compiled pass).

    `density`: sampled_density(new, base) if the caller already has it (sizes the output).
    `reuse`: kernels.scan_changes's (valid until this thread's next such scan).
    """
    if new.shape != base.shape or new.dtype != base.dtype or new.ndim != 1:
        raise ValueError(f"cannot compare {new.dtype}{new.shape} with {base.dtype}{base.shape}")
    density = sampled_density(new, base) if density is None else density
    positions, diff = kernels.scan_changes(new, base, density, reuse)
    return Changes(positions, diff)


def changed_positions(new: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Sorted int64 indices where the bit patterns of `new` and `base` differ."""
    return changes(new, base).positions
