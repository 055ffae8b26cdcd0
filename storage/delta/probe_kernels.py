"""Compiled probes the chooser runs on every tensor before coding it (numba, nogil).

  window_changes  how many elements differ inside evenly spaced sample windows (the sampled
                  density that picks raw or coded, Elias-Fano or ternary);
  gap_bits        bits per position of an octave code of the gaps between changes, over runs
                  of consecutive positions (payload.py's structure probe).
Each was a dozen small numpy calls per tensor (strided views, compares, counts, linspace, logs),
every one holding the GIL, which no other core can use meanwhile. One dispatch each now, and the
work itself runs without the GIL (bench/transfer/transfer_gil.py: on 2 encoding threads, the GIL held
28-31% of a 0.5B publish before, 22-26% after).
"""
from __future__ import annotations

import math

import numba
import numpy as np

from storage.delta.intrinsics import ctlz as _ctlz
from storage.delta.kernel_args import read_only as _ro


@numba.njit(nogil=True, cache=True)
def _window_changes(new: np.ndarray, base: np.ndarray, stride: int, window: int,
                    windows: int) -> int:
    k = 0
    for w in range(windows):
        for i in range(w * stride, w * stride + window):
            k += new[i] != base[i]
    return k


def window_changes(new: np.ndarray, base: np.ndarray, stride: int, window: int,
                   windows: int) -> int:
    """Elements of flat `new` and `base` that differ in `windows` windows of `window` elements
    starting every `stride` elements (the caller keeps them inside the arrays)."""
    if (windows - 1) * stride + window > min(new.size, base.size) or min(stride, window) < 0:
        raise ValueError(f"{windows} windows of {window} every {stride} do not fit "
                         f"{new.size} elements")
    return int(_window_changes(_ro(new), _ro(base), stride, window, windows))


@numba.njit(nogil=True, cache=True)
def _gap_bits(positions: np.ndarray, samples: int, run: int) -> float:
    k = positions.size
    counts = np.zeros(64, np.int64)
    if k > samples * run:  # `samples` runs, evenly spaced (as np.linspace(0, k - run, samples))
        stop = k - run
        step = stop / (samples - 1)
        starts = [stop if s == samples - 1 else int(s * step) for s in range(samples)]
    else:
        starts, run = [0], k
    for start in starts:
        for i in range(start + 1, start + run):
            gap = np.uint64(positions[i] - positions[i - 1])  # >= 1: sorted, distinct
            counts[np.uint64(63) - _ctlz(gap)] += 1
    total, weighted, octave_bits = 0, 0.0, 0.0
    for octave in range(64):
        c = counts[octave]
        if c:
            total += c
            weighted += c * math.log2(c)
            octave_bits += c * octave  # the offset inside octave o costs o bits, verbatim
    return math.log2(total) - weighted / total + octave_bits / total


def gap_bits(positions: np.ndarray, samples: int, run: int) -> float:
    """Bits per position of coding each gap as its octave, floor(log2(gap)), entropy-coded,
    plus its offset inside the octave verbatim (within ~0.5 bit of the gaps' entropy), over
    `samples` runs of `run` consecutive sorted positions, or all of them when there are no
    more than samples * run. Needs at least 2 positions."""
    if positions.size < 2 or samples < 2 or run < 2:
        raise ValueError(f"gap_bits needs >= 2 positions and runs (got {positions.size}, "
                         f"{samples} x {run})")
    return float(_gap_bits(_ro(np.asarray(positions, np.int64)), samples, run))


def warm_up() -> None:
    """Compile both probes for 16- and 32-bit patterns (kernels.warm_up calls this)."""
    for dtype in (np.uint16, np.uint32):
        a = np.zeros(64, dtype)
        window_changes(a, a, 16, 8, 4)
    gap_bits(np.arange(8, dtype=np.int64), 2, 2)
