"""Does the simulator's long-context cost hold on a GPU? Decode steps and prefill chunks timed
against the context already cached, beside what sim/engine_cost.py's roofline terms predict.

    python -m bench.sim.context_cost_check --fleet h200_qwen3_8b   # GPU machine, ~2 min
    # writes bench/results/context_cost_h200_qwen3_8b.json

The simulator prices a long context with two terms derived from published numbers (the device's
HBM bandwidth for KV reads, the profile's own prefill FLOP rate for chunk attention), on top of
curves measured at 512 tokens of context per request. Here the fleet's rollout architecture is
built with random weights on the GPU (executors/engine/hf_timer.py: SDPA with grouped-query heads,
a preallocated cache, CUDA-graph replays) and timed at growing cached contexts: what a step costs
beyond its 512-token point, measured, against the terms' prediction. A ratio near 1 says the
roofline holds for this kernel; above 1, the simulator under-prices long contexts by that factor.
The kernel is PyTorch's SDPA, not vLLM's paged attention (no vLLM on the lent machine): this
checks the shape and size of the bandwidth-bound cost model, not what a tuned engine reaches.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result
from sim.engine_cost import REFERENCE_CONTEXT
from sim.fleet import SHAPES, context_cost, load_fleet, shape_numbers

DECODE_BATCHES = (1, 16, 64)
CONTEXTS = (REFERENCE_CONTEXT, 2048, 8192, 32768)
MEMORY_SHARE = 0.75  # of the GPU memory free after the weights, at most, for one point's cache


def _rows(kind: str, batch: int, measured: dict[int, float], predict) -> list[dict]:
    base = measured.get(REFERENCE_CONTEXT)
    rows = []
    for ctx, t in sorted(measured.items()):
        extra = None if base is None else t - base
        want = predict(ctx) - predict(REFERENCE_CONTEXT)
        rows.append({"kind": kind, "batch": batch, "context": ctx, "ms": round(t * 1e3, 3),
                     "extra_ms": None if extra is None else round(extra * 1e3, 3),
                     "predicted_extra_ms": round(want * 1e3, 3),
                     "ratio": round(extra / want, 3) if extra is not None and want > 0 else None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fleet", default="h200_qwen3_8b", help="sim/profiles/fleet_NAME.json")
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from executors.engine.hf_timer import HFForwardTimer, build_random_model

    if not torch.cuda.is_available():
        sys.exit("context_cost_check: no CUDA device here (torch.cuda.is_available() is False)")
    spec = load_fleet(args.fleet)
    if spec.tp != 1:
        sys.exit(f"context_cost_check: fleet {args.fleet} runs its rollout engine at TP {spec.tp}; one GPU here")
    ctx_cost = context_cost(spec)
    if not ctx_cost.active:
        sys.exit(f"context_cost_check: fleet {args.fleet} has no memory bandwidth, so no context term to check")
    _, kv_bytes = shape_numbers(spec.rollout_shape)
    started = time.perf_counter()
    model = build_random_model(SHAPES / spec.rollout_shape, "cuda")
    timer = HFForwardTimer(model, "cuda", repeats=args.repeats)
    free_bytes = torch.cuda.mem_get_info()[0] * MEMORY_SHARE

    def fits(batch: int, context: int) -> bool:
        return batch * (context + args.chunk_tokens) * kv_bytes <= free_bytes

    rows, errors = [], []
    for batch in DECODE_BATCHES:
        contexts = [c for c in CONTEXTS if fits(batch, c)]
        times = timer.after_context(contexts, batch=batch)
        errors += times.errors
        rows += _rows("decode", batch, times.fastest(),
                      lambda c, b=batch: ctx_cost.decode_extra(b, b * c))
    chunk = args.chunk_tokens
    times = timer.after_context([c for c in CONTEXTS if fits(1, c)], batch=1, new_tokens=chunk)
    errors += times.errors
    rows += _rows(f"prefill chunk {chunk}", 1, times.fastest(), lambda c: ctx_cost.chunk_extra(chunk, c))

    long_rows = [r for r in rows if r["ratio"] is not None and r["context"] >= 8192]
    summary = {kind: statistics.median(r["ratio"] for r in long_rows if r["kind"] == kind)
               for kind in sorted({r["kind"] for r in long_rows})}
    decode_long = [r for r in long_rows if r["kind"] == "decode"]
    effective_tb_s = statistics.median(
        r["batch"] * (r["context"] - REFERENCE_CONTEXT) * kv_bytes / (r["extra_ms"] / 1e3) / 1e12
        for r in decode_long) if decode_long else None
    print_table(f"{args.fleet}: step time beyond the {REFERENCE_CONTEXT}-token point, measured on "
                f"{torch.cuda.get_device_name()} vs the simulator's context terms",
                ["step", "batch", "context", "ms", "extra ms", "predicted extra ms", "measured / predicted"],
                [(r["kind"], str(r["batch"]), f"{r['context']:,}", f"{r['ms']:.2f}",
                  "-" if r["extra_ms"] is None else f"{r['extra_ms']:.2f}", f"{r['predicted_extra_ms']:.2f}",
                  "-" if r["ratio"] is None else f"{r['ratio']:.2f}") for r in rows])
    print(f"median measured / predicted at >= 8k context: {summary}; "
          f"decode KV reads at {effective_tb_s and round(effective_tb_s, 2)} TB/s effective "
          f"(the simulator: {spec.memory_bandwidth_tb_s} TB/s)")
    out = args.out or RESULTS / f"context_cost_{args.fleet}.json"
    write_result(out, "context_cost_check", args, started, device=torch.cuda.get_device_name(),
                 torch=torch.__version__, context_cost=ctx_cost.source, kv_bytes_per_token=kv_bytes,
                 rows=rows, median_ratio_8k_plus=summary, decode_effective_tb_s=effective_tb_s,
                 errors=errors)


if __name__ == "__main__":
    main()
