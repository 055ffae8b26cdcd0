"""Packing a dense version into buckets and verifying them: the checksum work on each side.

A dense publish (a full snapshot, the first sync of a receiver, or the baseline the transfer
benches compare ours with) packs every tensor's bytes into 64 MB buckets, with a checksum per
entry and per bucket (storage/weights/buckets.py); a receiver verifies every bucket it fetches.
This bench packs the Qwen2.5-0.5B shape's tensors (bench/transfer_workloads.qwen_shapes, random
bf16 bits: checksums do not care what the bits are) raw, as publish_weights does, then verifies
every bucket as a receiver does, --repeat times after a warm-up, one thread; per side the median
seconds, CPU seconds and GB per CPU second.

    .venv/bin/python -m bench.transfer.bucket_pack [--params 494e6] [--repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--params", type=float, default=494e6, help="synthetic model size")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS / "bucket_pack.json")
    args = p.parse_args()
    if args.params < 1 or args.repeat < 1:
        sys.exit("--params and --repeat must be >= 1")
    import numpy as np
    import torch
    from bench.transfer.transfer_workloads import qwen_shapes
    from storage.weights.buckets import pack_buckets, verify_bucket
    from storage.weights.payloads import raw_encoder

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    shapes, _ = qwen_shapes(args.params)
    tensors = {name: torch.from_numpy(rng.integers(0, 1 << 16, shape, dtype=np.uint16)
                                      .view(np.int16)).view(torch.bfloat16)
               for name, shape in shapes}
    items = [(name, *raw_encoder(name, t)) for name, t in tensors.items()]
    dense = sum(t.numel() * t.element_size() for t in tensors.values())
    runs = []
    for _ in range(args.repeat + 1):  # the first: warm-up (fresh bucket memory faults in)
        t, cpu = time.perf_counter(), time.process_time()
        packed = list(pack_buckets(items))
        pack_s, pack_cpu = time.perf_counter() - t, time.process_time() - cpu
        t, cpu = time.perf_counter(), time.process_time()
        for info, blob in packed:
            verify_bucket(info, blob)
        runs.append({"pack_s": pack_s, "pack_cpu_s": pack_cpu,
                     "verify_s": time.perf_counter() - t, "verify_cpu_s": time.process_time() - cpu,
                     "buckets": len(packed)})
        del packed
    med = {k: statistics.median(r[k] for r in runs[1:]) for k in runs[0]}
    row = {**med, "dense_gb": dense / 1e9, "pack_gb_per_cpu_s": dense / 1e9 / med["pack_cpu_s"],
           "verify_gb_per_cpu_s": dense / 1e9 / med["verify_cpu_s"]}
    print_table(f"{dense / 1e6:.0f} MB dense in {med['buckets']:.0f} buckets (medians of "
                f"{args.repeat}, one thread)", ("side", "s", "CPU s", "GB / CPU s"),
                [(side, f"{med[side + '_s']:.3f}", f"{med[side + '_cpu_s']:.3f}",
                  f"{row[side + '_gb_per_cpu_s']:.2f}") for side in ("pack", "verify")])
    write_result(args.out, "bucket_pack", args, t0, result=row, runs=runs)


if __name__ == "__main__":
    main()
