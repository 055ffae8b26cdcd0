"""One transformer layer of a large model through the codec: sender and receiver CPU per GB.

The 0.5B shape the transfer benches use has one tensor of 32 MB or more (its embedding), so
what the codec does with large tensors (blocks.py: coded and applied in 8 MB blocks on every
core) is a quarter of its bytes there; in a 7B model it is nearly all of them. This bench codes
one layer of a given shape (default Qwen2.5-7B: hidden 3584, intermediate 18944, 4 KV heads of
128), AdamW at --lr for one step (bench/transfer_workloads.adamw_versions), tensor by tensor as
the publisher does (encode_delta), then applies every payload in place as receivers do
(apply_delta), --repeat times after a warm-up; per side, the median seconds and CPU seconds
and the dense GB per CPU second.

    .venv/bin/python -m bench.transfer.codec_layer [--hidden 3584 --intermediate 18944 --kv 512]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result
from storage.cores import available_cores



def layer_shapes(hidden: int, intermediate: int, kv: int) -> list[tuple[str, tuple[int, int]]]:
    """A Qwen2-style decoder layer's matrices (norms and biases: too small to matter here)."""
    return [("q_proj", (hidden, hidden)), ("k_proj", (kv, hidden)), ("v_proj", (kv, hidden)),
            ("o_proj", (hidden, hidden)), ("gate_proj", (intermediate, hidden)),
            ("up_proj", (intermediate, hidden)), ("down_proj", (hidden, intermediate))]


def timed(fn) -> tuple[float, float]:
    t, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=3584)
    p.add_argument("--intermediate", type=int, default=18944)
    p.add_argument("--kv", type=int, default=512, help="rows of k_proj and v_proj")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS / "codec_layer_7b.json")
    args = p.parse_args()
    if min(args.hidden, args.intermediate, args.kv, args.repeat) < 1:
        sys.exit("--hidden, --intermediate, --kv and --repeat must be >= 1")
    from bench.transfer.transfer_workloads import adamw_versions
    from storage.delta import apply_delta, encode_delta, kernels

    t0 = time.perf_counter()
    kernels.warm_up()
    pairs = {}
    for i, (name, shape) in enumerate(layer_shapes(args.hidden, args.intermediate, args.kv)):
        old, new = adamw_versions(name, shape, args.lr, 1, i)
        pairs[name] = (old, new)
    dense = sum(new.numel() * new.element_size() for _, new in pairs.values())
    payloads: dict = {}
    held = {name: old.clone() for name, (old, _) in pairs.items()}

    def encode() -> None:
        for name, (old, new) in pairs.items():
            payloads[name] = encode_delta(new, old, name=name, base_version=0,
                                          target_version=1)

    def apply() -> None:
        for name, payload in payloads.items():
            apply_delta(payload, held[name], base_version=0, in_place=True)

    runs = []
    for _ in range(args.repeat + 1):  # the first: warm-up
        enc = timed(encode)
        for name, (old, _) in pairs.items():
            held[name].copy_(old)
        app = timed(apply)
        runs.append({"encode_s": enc[0], "encode_cpu_s": enc[1], "apply_s": app[0],
                     "apply_cpu_s": app[1]})
    med = {k: statistics.median(r[k] for r in runs[1:]) for k in runs[0]}
    coded = sum(memoryview(p).nbytes for p in payloads.values())
    row = {**med, "dense_gb": dense / 1e9, "coded_mb": coded / 1e6,
           "encode_gb_per_cpu_s": dense / 1e9 / med["encode_cpu_s"],
           "apply_gb_per_cpu_s": dense / 1e9 / med["apply_cpu_s"]}
    print_table(f"one layer, hidden {args.hidden}, intermediate {args.intermediate}, lr "
                f"{args.lr:g}: {dense / 1e6:.0f} MB dense, {coded / 1e6:.1f} MB coded (medians "
                f"of {args.repeat}, {available_cores()} cores)",
                ("side", "s", "CPU s", "dense GB / CPU s"),
                [(side, f"{med[side + '_s']:.3f}", f"{med[side + '_cpu_s']:.3f}",
                  f"{row[side + '_gb_per_cpu_s']:.2f}") for side in ("encode", "apply")])
    write_result(args.out, "codec_layer", args, t0, result=row, runs=runs)


if __name__ == "__main__":
    main()
