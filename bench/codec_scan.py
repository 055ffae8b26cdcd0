"""The codec's change scan: numpy (storage/delta/bits.changes) vs a numba-compiled fused kernel.

Issue 15 asked to choose between vectorised numpy and numba by measurement. The scan (compare
new with base, collect changed positions and their differences) is the one per-element pass of
encoding a delta; this times both on the same bf16 bit patterns at several change densities,
best of --repeat, one thread, side by side in one run, and checks they agree exactly.
numba is the one vLLM installs (not a ROSE dependency); without it the bench says so and stops.

    .venv/bin/python bench/codec_scan.py [--elements 64e6] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from storage.delta import bits  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DENSITIES = (0.001, 0.01, 0.042, 0.15)  # 0.042: the 0.5B shape's AdamW delta at lr 1e-6


def _fused_kernel():
    import numba

    @numba.njit(nogil=True)
    def fused(a, b):  # count, then fill: one compare per element per pass, no temporaries
        count = 0
        for i in range(a.size):
            count += a[i] != b[i]
        positions, diff, j = np.empty(count, np.int64), np.empty(count, a.dtype), 0
        for i in range(a.size):
            if a[i] != b[i]:
                positions[j], diff[j] = i, a[i] - b[i]
                j += 1
        return positions, diff

    return fused


def _best(fn, repeat: int):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--elements", type=float, default=64e6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "codec_scan.json")
    args = ap.parse_args()
    try:
        fused = _fused_kernel()
    except ImportError:
        sys.exit("numba is not installed here (it comes with vLLM): nothing to compare")
    n, rng = int(args.elements), np.random.default_rng(0)
    base = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    fused(base[:8], base[:8])  # compile outside the timing
    rows = []
    for density in DENSITIES:
        new = base.copy()
        new[rng.random(n) < density] += 1
        t_np, ch = _best(lambda: bits.changes(new, base), args.repeat)
        t_nb, (pos, diff) = _best(lambda: fused(new, base), args.repeat)
        if not (np.array_equal(pos, ch.positions) and np.array_equal(diff, ch.diff)):
            raise AssertionError(f"numba and numpy disagree at density {density}")
        dense_bytes = 2 * new.nbytes  # both tensors read
        rows.append({"density": density, "changed": int(pos.size), "numpy_s": t_np,
                     "numba_s": t_nb, "numpy_GBps": dense_bytes / t_np / 1e9,
                     "numba_GBps": dense_bytes / t_nb / 1e9, "numba_over_numpy": t_np / t_nb})
    table = Table(title=f"change scan, {n:,} bf16 elements, one thread, best of {args.repeat}")
    for col in ("density", "numpy ms", "numba ms", "numpy GB/s", "numba GB/s", "numba speed-up"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['density']:.1%}", f"{r['numpy_s'] * 1e3:.0f}", f"{r['numba_s'] * 1e3:.0f}",
                      f"{r['numpy_GBps']:.2f}", f"{r['numba_GBps']:.2f}", f"{r['numba_over_numpy']:.2f}x")
    Console().print(table)
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps({"bench": "codec_scan", "elements": n, "repeat": args.repeat,
                                    "machine": platform.platform(), "cpus": os.cpu_count(),
                                    "load_average": os.getloadavg(), "rows": rows}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
