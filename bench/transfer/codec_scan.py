"""The codec's two per-element passes, numpy vs the compiled kernels (storage/delta/kernels.py).

Issue 15 asked to choose between vectorised numpy and numba by measurement. Encoding a delta
scans every element (compare new with base, collect changed positions and their differences);
applying one writes the differences onto a copy of the base at the Elias-Fano positions. This
times, on the same bf16 bit patterns at several change densities, best of --repeat, one thread,
side by side in one run: the scan as numpy does it best (cache-sized chunks, one subtraction,
flatnonzero on the bool mask) against kernels.scan_changes, and the apply as numpy does it
(elias_fano.decode, then a fancy-index add on a copy) against kernels.ef_apply; every result
is checked equal.

    .venv/bin/python -m bench.transfer.codec_scan [--elements 64e6] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from storage.delta import elias_fano, kernels

from bench.lib.results import RESULTS, write_json
DENSITIES = (0.001, 0.01, 0.042, 0.15)  # 0.042: the 0.5B shape's AdamW delta at lr 1e-6


def numpy_scan(new: np.ndarray, base: np.ndarray, chunk: int = 1 << 18):
    """numpy's best change scan: in cache-sized chunks, d = new - base, flatnonzero(d != 0)."""
    pos, diff = [], []
    for start in range(0, new.size, chunk):
        d = new[start:start + chunk] - base[start:start + chunk]
        p = np.flatnonzero(d != 0)
        pos.append(p + start)
        diff.append(d[p])
    return np.concatenate(pos), np.concatenate(diff)


def numpy_apply(blob: bytes, base: np.ndarray, diff: np.ndarray) -> np.ndarray:
    positions, _ = elias_fano.decode(blob)
    out = base.copy()
    out[positions] += diff
    return out


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
    n, rng = int(args.elements), np.random.default_rng(0)
    base = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    kernels.scan_changes(base[:100], base[:100])  # compile (or load) outside the timing
    rows = []
    for density in DENSITIES:
        new = base.copy()
        new[rng.random(n) < density] += 1
        t_np, (pos, diff) = _best(lambda: numpy_scan(new, base), args.repeat)
        t_nb, (kpos, kdiff) = _best(lambda: kernels.scan_changes(new, base, density), args.repeat)
        if not (np.array_equal(pos, kpos) and np.array_equal(diff, kdiff)):
            raise AssertionError(f"scan: kernel and numpy disagree at density {density}")
        blob = elias_fano.encode(pos, n)
        count, _, low, lows, unary = elias_fano.split(blob)
        a_np, out = _best(lambda: numpy_apply(blob, base, diff), args.repeat)
        a_nb, kout = _best(lambda: kernels.ef_apply(base, lows, unary, count, low, diff),
                           args.repeat)
        if not (np.array_equal(out, new) and np.array_equal(kout, new)):
            raise AssertionError(f"apply: a result differs from new at density {density}")
        gb = new.nbytes / 1e9  # dense bytes of the tensor
        rows.append({"density": density, "changed": int(pos.size),
                     "scan_numpy_s": t_np, "scan_kernel_s": t_nb, "scan_speedup": t_np / t_nb,
                     "scan_kernel_GBps": gb / t_nb, "apply_numpy_s": a_np, "apply_kernel_s": a_nb,
                     "apply_speedup": a_np / a_nb, "apply_kernel_GBps": gb / a_nb})
    table = Table(title=f"codec passes, {n:,} bf16 elements, one thread, best of {args.repeat}"
                        " (GB/s of the tensor's dense bytes)")
    for col in ("density", "scan numpy ms", "scan kernel ms", "speed-up", "kernel GB/s",
                "apply numpy ms", "apply kernel ms", "speed-up", "kernel GB/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['density']:.1%}", f"{r['scan_numpy_s'] * 1e3:.0f}",
                      f"{r['scan_kernel_s'] * 1e3:.0f}", f"{r['scan_speedup']:.2f}x",
                      f"{r['scan_kernel_GBps']:.2f}", f"{r['apply_numpy_s'] * 1e3:.0f}",
                      f"{r['apply_kernel_s'] * 1e3:.0f}", f"{r['apply_speedup']:.2f}x",
                      f"{r['apply_kernel_GBps']:.2f}")
    Console().print(table)
    write_json(args.out, {"bench": "codec_scan", "elements": n, "repeat": args.repeat,
                          "machine": platform.platform(), "cpus": os.cpu_count(),
                          "load_average": os.getloadavg(), "rows": rows})


if __name__ == "__main__":
    main()
