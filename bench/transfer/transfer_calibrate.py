"""Calibrate storage/delta/time_model.py: per-encoding encode/apply cost, and thread scaling.

Per tensor (the demo policy's own shapes, plus 64 KB, 2 MB and 8 MB AdamW deltas; lr 1e-6,
1e-5 and the demo's 5e-4), the best of 3 single-thread encode_delta / apply_delta (in place,
as receivers apply) times with the codec's own choice, and raw's trip through memory on each
side (64 KB-64 MB: fresh bucket memory and two hashes); a least-squares fit per encoding of
time = fixed + bytes / speed.
Then two large tensors encoded and applied by 1 and 2 threads (storage/weights/parallel.py), for
the speed-up the thread pool gets. Prints a table; JSON in bench/results/ (--out).

    .venv/bin/python -m bench.transfer.transfer_calibrate
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from bench.transfer import transfer_workloads as wl
from storage.delta import apply_delta, encode_delta, kernels, read_header
from storage.delta.host_speed import (apply_in_place_seconds, best_seconds as _best,
                                      raw_trip_seconds)
from storage.weights.parallel import ordered_map
from bench.lib.results import RESULTS, write_json


def per_tensor(lrs: list[float]) -> list[dict]:
    rows = []
    for lr in lrs:
        old, new = wl.demo_policy_model(lr, 1)
        for shape in [(256, 128), (1024, 1024), (4096, 1024)]:
            v = wl.adamw_versions("model.layers.0.mlp.up_proj.weight", shape, lr, 1, 0)
            old[f"x{shape}"], new[f"x{shape}"] = v[0], v[1]
        for name in old:
            o, n = old[name], new[name]
            payload = encode_delta(n, o, name=name, base_version=0, target_version=1)
            rows.append({"lr": lr, "name": name, "bytes": n.numel() * 2,
                         "encoding": read_header(payload).encoding, "coded": len(payload),
                         "encode_s": _best(lambda: encode_delta(
                             n, o, name=name, base_version=0, target_version=1)),
                         "apply_s": apply_in_place_seconds(payload, o)})
    for size in (64 << 10, 2 << 20, 16 << 20, 64 << 20):  # raw: its bytes' trip through memory
        rows.append({"lr": None, "name": f"raw {size}", "bytes": size, "encoding": "raw",
                     "coded": size, "encode_s": (t := raw_trip_seconds(size)), "apply_s": t})
    return rows


def fit(rows: list[dict]) -> dict[str, dict]:
    by = defaultdict(list)
    for r in rows:
        by[r["encoding"]].append(r)
    out = {}
    for method, rs in by.items():
        x = np.array([[1.0, r["bytes"]] for r in rs])
        fits = {}
        for stage in ("encode_s", "apply_s"):
            fixed, per_byte = np.linalg.lstsq(x, np.array([r[stage] for r in rs]), rcond=None)[0]
            fits[stage] = {"fixed_us": fixed * 1e6,
                           "gbps": 1 / per_byte / 1e9 if per_byte > 0 else float("inf")}
        out[method] = {"tensors": len(rs), **fits}
    return out


def scaling(lr: float = 1e-6) -> dict[str, float]:
    v = wl.adamw_versions("model.layers.0.mlp.up_proj.weight", (4096, 2048), lr, 1, 0)
    pairs = [(v[0], v[1])] * 4
    nbytes = 4 * v[1].numel() * 2
    enc = lambda p: encode_delta(p[1], p[0], name="w", base_version=0, target_version=1)  # noqa: E731
    payloads = [enc(p) for p in pairs]
    out = {}
    for workers in (1, 2):
        e = _best(lambda: list(ordered_map(enc, pairs, workers)))
        a = _best(lambda: list(ordered_map(lambda p: apply_delta(p, v[0], base_version=0),
                                           payloads, workers)))
        out[f"encode_gbps_{workers}"], out[f"apply_gbps_{workers}"] = nbytes / e / 1e9, nbytes / a / 1e9
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5, 5e-4])
    p.add_argument("--out", type=Path, default=RESULTS /
                   "transfer_calibrate.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    kernels.warm_up()  # compiled once per process, not a cost of any tensor
    rows = per_tensor(args.lrs)
    fits, scale = fit(rows), scaling()
    for method, f in fits.items():
        print(f"{method:9s} {f['tensors']:3d} tensors  encode {f['encode_s']['fixed_us']:6.0f} us "
              f"+ {f['encode_s']['gbps']:5.2f} GB/s   apply {f['apply_s']['fixed_us']:6.0f} us "
              f"+ {f['apply_s']['gbps']:5.2f} GB/s")
    print("threads 1 -> 2: encode {encode_gbps_1:.2f} -> {encode_gbps_2:.2f} GB/s, apply "
          "{apply_gbps_1:.2f} -> {apply_gbps_2:.2f} GB/s".format(**scale))
    write_json(args.out, {"bench": "transfer_calibrate", "fits": fits, "scaling": scale, "rows": rows})


if __name__ == "__main__":
    main()
