"""The torch backend of bench/sim/engine_profile.py: a LatencyProfile measured with plain PyTorch.

Builds the architecture in --model with random weights on --device, times prefill (whole and
chunked) and decode steps with executors/engine/hf_timer.py, and returns the profile JSON with
both timings: each saved point is the faster of the eager forward and its CUDA-graph replay
(the replay removes launch costs, as vLLM's graphs do for decode).
"""
from __future__ import annotations

import json
import platform
import time
from argparse import Namespace

from executors.policies.latency_profile import Curve, LatencyProfile

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def prefill_lengths(max_model_len: int, chunk: int) -> list[int]:
    top = max_model_len - 16  # room for the sampled token, as the vLLM profiler leaves
    base = [16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384]
    return sorted({x for x in base + [chunk, top] if 0 < x <= top})


def _curve(times, label: str) -> tuple[Curve, str]:
    """The faster way per size (ForwardTimes.fastest) as a curve, and which ways those were."""
    fastest = times.fastest()
    if len(fastest) < 2:
        raise SystemExit(f"{label}: fewer than two points measured ({times.errors})")
    ways = {"cuda graph" if times.graphed.get(size) == t else "eager" for size, t in fastest.items()}
    return Curve(tuple(fastest), tuple(fastest.values())), " + ".join(sorted(ways))


def _ms(d: dict) -> dict:
    return {int(k): round(v * 1000, 3) for k, v in sorted(d.items())}


def measure_torch(args: Namespace) -> dict:
    import torch

    from executors.engine.hf_timer import HFForwardTimer, build_random_model

    t0 = time.perf_counter()
    model = build_random_model(args.model, args.device)
    built_s = time.perf_counter() - t0
    timer = HFForwardTimer(model, args.device, repeats=args.repeats, decode_context=args.decode_context)
    lengths = prefill_lengths(args.max_model_len, args.chunk_tokens)
    measured = {"monolithic": timer.prefill(lengths),
                "chunked": timer.prefill(lengths, chunk=args.chunk_tokens),
                "decode": timer.decode([b for b in BATCHES if b <= args.max_num_seqs])}
    curves = {label: _curve(times, label) for label, times in measured.items()}
    profile = LatencyProfile(curves["monolithic"][0], curves["chunked"][0], curves["decode"][0],
                             args.chunk_tokens, f"{args.role}:{args.model.name}")
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.machine()
    model_cfg = json.loads((args.model / "config.json").read_text())
    saved = json.loads(profile.to_json())
    saved.update({
        "source": (f"measured by python -m bench.sim.engine_profile --backend torch (executors/engine/hf_timer.py: "
                   f"transformers {_version('transformers')}, torch {torch.__version__}, "
                   "SDPA with native grouped-query heads and no mask, "
                   f"bf16 random weights) on {device} at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
                   f"curves: " + ", ".join(f"{k} {v[1]}" for k, v in curves.items())
                   + f"; decode at {args.decode_context} tokens of context per request; "
                   "no paged attention, no continuous batching: one forward per step"),
        "gpu_kind": args.gpu_kind, "device": device, "build_s": round(built_s, 1),
        "graphed_ms": {k: _ms(t.graphed) for k, t in measured.items()},
        "eager_ms": {k: _ms(t.eager) for k, t in measured.items()},
        "errors": [e for t in measured.values() for e in t.errors],
        "model": {k: model_cfg.get(k) for k in ("architectures", "hidden_size", "num_hidden_layers",
                                                "num_attention_heads", "num_key_value_heads",
                                                "intermediate_size", "vocab_size")},
    })
    return saved


def _version(dist: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"
