"""The chooser's compiled probes (storage/delta/probe_kernels.py) give what the numpy they
replaced gave: the same sampled change count, the same gap-octave bits per position."""
from __future__ import annotations

import numpy as np
import pytest

from storage.delta import bits, probe_kernels


def _numpy_gap_bits(positions: np.ndarray, samples: int, run: int) -> float:
    """The structure probe as payload.py computed it before (linspace starts, numpy sums)."""
    k = positions.size
    if k > samples * run:
        starts = np.linspace(0, k - run, samples).astype(np.int64)
    else:
        starts, run = np.zeros(1, np.int64), k
    counts = np.zeros(64, np.int64)
    for s in starts:
        gaps = np.diff(positions[s:s + run]).astype(np.uint64)
        np.add.at(counts, np.floor(np.log2(gaps.astype(np.float64))).astype(np.int64), 1)
    octaves = np.flatnonzero(counts)
    c = counts[octaves]
    total = int(c.sum())
    return float(np.log2(total) - np.sum(c * np.log2(c)) / total + np.sum(c * octaves) / total)


@pytest.mark.parametrize("kind", ["uniform", "rows", "stride", "few"])
def test_gap_bits_equal_the_numpy_probe(kind):
    rng = np.random.default_rng(3)
    n = 1 << 22
    if kind == "uniform":
        positions = np.sort(rng.choice(n, 200_000, replace=False))
    elif kind == "rows":  # whole rows of 896 moved: runs of gap 1, a few long jumps
        rows = np.sort(rng.choice(n // 896, 300, replace=False))
        positions = (rows[:, None] * 896 + np.arange(896)).reshape(-1)
    elif kind == "stride":
        positions = np.arange(0, n, 7)
    else:  # under samples * run: one run over every position
        positions = np.sort(rng.choice(n, 3000, replace=False))
    positions = positions.astype(np.int64)
    got = probe_kernels.gap_bits(positions, 16, 4096)
    assert got == pytest.approx(_numpy_gap_bits(positions, 16, 4096), rel=1e-12)
    if kind == "stride":
        assert got == pytest.approx(2.0)  # one octave (gap 7): 0 bits for it, 2 for the offset


def test_sampled_density_counts_the_windows_exactly():
    rng = np.random.default_rng(5)
    base = rng.integers(0, 1 << 16, 1 << 21, dtype=np.uint16)
    new = base.copy()
    moved = rng.random(base.size) < 0.1
    new[moved] ^= 1
    rows_new, rows_base = bits.sample_rows(new), bits.sample_rows(base)
    want = np.count_nonzero(rows_new != rows_base) / rows_new.size
    assert bits.sampled_density(new, base) == want
    assert 0.08 < want < 0.12
    assert bits.sampled_density(new[:1000], base[:1000]) is None  # small: looked at whole


def test_probes_refuse_what_does_not_fit():
    a = np.zeros(100, np.uint16)
    with pytest.raises(ValueError, match="do not fit"):
        probe_kernels.window_changes(a, a, 50, 60, 2)
    with pytest.raises(ValueError, match="2 positions"):
        probe_kernels.gap_bits(np.zeros(1, np.int64), 16, 4096)
