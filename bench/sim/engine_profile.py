"""Measure one engine's latency profile and save it where the cluster simulator reads profiles.

The same measurement a serving worker makes at start-up (executors/coserving/profile.py:
prefill against prompt length, whole and chunked, and decode step time against batch) on a
model directory of your choice, written to sim/profiles/NAME.json with where and how it was
measured. On a GPU machine (`ROSE_DEVICE=cuda`, the `gpu` extra) this is how a GPU-kind
profile for `python -m bench.sim.cluster_sim --rollout-profile NAME` is made: measured, not invented.

    .venv/bin/python -m bench.sim.engine_profile --model .rose/models/policy --name cpu_policy_new
    ROSE_DEVICE=cuda python -m bench.sim.engine_profile --model /models/qwen3-8b --name h100_qwen3_8b

Where vLLM is not installed (a lent GPU machine with no network), `--backend torch` times the
same three curves with plain PyTorch on random weights of an architecture
(executors/engine/hf_timer.py: eager and CUDA-graph replays; the graphed curves are saved, the
eager ones kept beside them):

    python -m bench.sim.engine_profile --backend torch --device cuda \
        --model sim/profiles/shapes/qwen3-8b --name h100_qwen3_8b --gpu-kind H100-SXM-80GB
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from bench.lib.results import write_json
from sim.profiles import PROFILE_DIR


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a Hugging Face model directory")
    ap.add_argument("--name", required=True, help="saved as sim/profiles/NAME.json")
    ap.add_argument("--role", choices=["rollout", "serving"], default="rollout",
                    help="rollout: chunked prefill and rollout sampling; serving: whole prompts")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--chunk-tokens", type=int, default=512)
    ap.add_argument("--max-num-seqs", type=int, default=64, help="largest decode batch measured")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpu-kind", default="", help="e.g. H100-SXM-80GB (recorded, not used)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing profile")
    ap.add_argument("--backend", choices=["vllm", "torch"], default="vllm",
                    help="vllm: the serving worker's own engine; torch: plain PyTorch forwards")
    ap.add_argument("--device", default="cpu", help="torch backend: cpu or cuda")
    ap.add_argument("--decode-context", type=int, default=512,
                    help="torch backend: tokens of context each decoding request holds")
    ap.add_argument("--out", type=Path, default=PROFILE_DIR, help="folder the profile is written to")
    args = ap.parse_args()
    if not (args.model / "config.json").is_file():
        ap.error(f"{args.model} is not a Hugging Face model directory (no config.json)")
    out = args.out / f"{args.name}.json"
    if out.exists() and not args.force:
        ap.error(f"{out} exists; pass --force to measure over it")

    if args.backend == "torch":
        from bench.sim.engine_profile_torch import measure_torch
        t0 = time.perf_counter()
        saved = measure_torch(args)
        write_json(out, saved)
        print(json.dumps({k: saved[k] for k in ("graphed_ms", "eager_ms", "errors")}, indent=1))
        print(f"measured in {time.perf_counter() - t0:.0f} s")
        return

    from executors.coserving.config import CoServingConfig
    from executors.coserving.engines import open_engine
    from executors.coserving.profile import machine_fingerprint, profile_summary
    from executors.engine.budgeted_scheduler import release_engine

    cfg = CoServingConfig(serving_model_dir=args.model, rollout_model_dir=args.model,
                          max_model_len=args.max_model_len, chunk_tokens=args.chunk_tokens,
                          max_num_seqs=args.max_num_seqs, profile_repeats=args.repeats)
    t0 = time.perf_counter()
    engine, _, profile, how = open_engine(cfg, args.role)
    release_engine(engine)
    model_cfg = json.loads((args.model / "config.json").read_text())
    saved = json.loads(profile.to_json())
    saved.update({
        "source": f"measured by bench/sim/engine_profile.py ({how}; executors/coserving/profile.py "
                  f"measure_engine) on {platform.node()} at "
                  f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, device "
                  f"{os.environ.get('ROSE_DEVICE', 'cpu')}, role {args.role}, chunk "
                  f"{args.chunk_tokens}, max_model_len {args.max_model_len}",
        "gpu_kind": args.gpu_kind, "machine": machine_fingerprint(),
        "model": {k: model_cfg.get(k) for k in ("architectures", "hidden_size", "num_hidden_layers",
                                                "num_attention_heads", "num_key_value_heads",
                                                "intermediate_size", "vocab_size")}})
    write_json(out, saved)
    print(json.dumps(profile_summary(profile), indent=1))
    print(f"measured in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
