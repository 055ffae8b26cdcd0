"""Measure one training step's time per token for an architecture: what the cluster simulator's
step model needs of a GPU kind (sim/fleet.py reads sim/profiles/<profile>_train.json).

A whole 8B model with its gradients and AdamW states does not fit one GPU, so the step
(forward, backward, AdamW) is timed on the architecture cut to a few layers, twice, and the
per-layer cost fitted: full = (cut model) + (layers - kept) x per layer. Plain PyTorch, random
weights, bf16, one sequence of --tokens tokens; no tensor or data parallel communication.

    python -m bench.sim.train_profile --device cuda --model sim/profiles/shapes/qwen3-8b \\
        --name h100_qwen3_8b_train
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from bench.lib.results import write_json
from sim.profiles import PROFILE_DIR


def step_seconds(model_dir: Path, device: str, layers: int, tokens: int, repeats: int) -> float:
    import torch

    from executors.engine.hf_timer import build_random_model

    model = build_random_model(model_dir, device, num_hidden_layers=layers).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    ids = torch.randint(3, model.config.vocab_size, (1, tokens), device=device)

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: AdamW states are made, kernels chosen
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)  # the model and its optimizer are freed on return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a directory with the architecture's config.json")
    ap.add_argument("--name", required=True, help="saved as NAME.json under --out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, nargs=2, default=[2, 4], help="the two cut depths timed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=PROFILE_DIR)
    args = ap.parse_args()
    if not (args.model / "config.json").is_file():
        ap.error(f"{args.model} has no config.json")
    few, more = sorted(args.layers)
    if few < 1 or few == more:
        ap.error("--layers needs two different depths >= 1")
    full_layers = json.loads((args.model / "config.json").read_text())["num_hidden_layers"]
    t_few = step_seconds(args.model, args.device, few, args.tokens, args.repeats)
    t_more = step_seconds(args.model, args.device, more, args.tokens, args.repeats)
    per_layer = (t_more - t_few) / (more - few)
    full = t_few + (full_layers - few) * per_layer
    import torch
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    saved = {"train_s_per_token": full / args.tokens, "step_s_full_model": full,
             "step_s": {str(few): t_few, str(more): t_more}, "per_layer_s": per_layer,
             "tokens": args.tokens, "layers": full_layers, "device": device,
             "source": f"measured by bench/sim/train_profile.py on {device} at "
                       f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: forward + backward + AdamW, "
                       f"bf16 random weights, {args.tokens} tokens, cut to {few} and {more} layers and "
                       f"fitted to {full_layers}; one GPU, no parallel communication"}
    write_json(args.out / f"{args.name}.json", saved)
    print(json.dumps(saved, indent=1))


if __name__ == "__main__":
    main()
