"""Trainer backends side by side: time per GRPO step and memory per rank, the Hugging Face
trainer against the megatron-core trainer at TP=1 and TP=2, on the demo policy's shape and on a
~100M-parameter Qwen3 shape.

    python -m bench.learning.train_backends                  # ~4 min here; writes bench/results/train_backends.json
    python -m bench.learning.train_backends --shapes demo --steps 2

Every configuration starts from the same random weights and trains on the same synthetic turns
(8 two-turn trajectories a step, micro-batch 4), in processes of its own (one per rank, gloo,
one thread each: as the stack's trainer workers run). Per rank: the median step time after one
warm-up step, the process's peak resident memory, and the bytes of its training state (fp32
weights, gradients and AdamW's two moments). The loss of the last step is printed beside: it
depends on the weights trained so far, so equal losses say the backends trained the same thing.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from bench.lib.results import RESULTS, print_table, write_result

SHAPES = {  # Qwen3 dims: the demo policy (rose/models/build.py) and a ~100M-parameter model
    "demo": dict(vocab_size=408, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, intermediate_size=384),
    "100m": dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 num_key_value_heads=4, head_dim=64, intermediate_size=2048),
}
BACKENDS = {"hf": None, "megatron-tp1": (1, 1), "megatron-tp2": (2, 1)}  # -> (tp, pp)


def write_policy(path: Path, dims: dict) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(**dims, tie_word_embeddings=True, pad_token_id=0, max_position_embeddings=2048)
    Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


def synthetic_turns(step: int, vocab: int, trajectories: int = 8):
    """A step's synthetic turns: two turns per trajectory, prompts of 48-96 tokens, responses
    of 24-56, advantages of both signs; every other trajectory's second turn one version
    behind, so its TIS weight (and the loss) depends on the weights being trained."""
    import pyarrow as pa
    import torch

    gen = torch.Generator().manual_seed(step)
    rows = []
    for t in range(trajectories):
        n = lambda lo, hi: int(torch.randint(lo, hi, (), generator=gen))  # noqa: E731
        ids = lambda k: torch.randint(1, vocab, (k,), generator=gen).tolist()  # noqa: E731
        prompt, first = ids(n(48, 96)), ids(n(24, 56))
        second_prompt, second = prompt + first + ids(8), ids(n(24, 56))
        adv = (t % 3 - 1) * 0.5 + 0.25  # -0.25, 0.25, 0.75: a loss that is not 0 on-policy
        for turn, (p, r) in enumerate(((prompt, first), (second_prompt, second))):
            rows.append({"trajectory": f"t{t}", "turn": turn, "prompt_ids": p, "response_ids": r,
                         "advantage": adv, "logprobs": [-5.0] * len(r),
                         "policy_version": step - 1 - (turn * (t % 2))})
    return pa.Table.from_pylist(rows)


def _rank(rank: int, backend: str, policy: str, data: str, rendezvous: str, steps: int, out: str) -> None:
    import torch

    from core.config import ModelsConfig, RunConfig, TrainConfig, TrainParallel

    os.environ["ROSE_DATA_DIR"] = data
    torch.set_num_threads(1)
    layout = BACKENDS[backend]
    train = TrainConfig(micro_batch=4, lr=1e-5) if layout is None else \
        TrainConfig(backend="megatron", micro_batch=4, lr=1e-5, parallel=TrainParallel(tp=layout[0], pp=layout[1]))
    cfg = RunConfig(run_id=backend, models=ModelsConfig(policy_dir=Path(policy)), train=train)
    if layout is None:
        from executors.workers.trainer import Trainer

        trainer, leave = Trainer(cfg), lambda: None
    else:
        from executors.training.megatron_trainer import MegatronTrainer
        from executors.training.process_group import join, leave

        join(rank, cfg.train.parallel, rendezvous)
        trainer = MegatronTrainer(cfg)
    try:
        vocab = int(trainer.model.config.vocab_size) if layout is None else int(trainer.hf_config.vocab_size)
        times, losses = [], []
        for step in range(1, steps + 2):
            t0 = time.perf_counter()
            stats = trainer.train_step(synthetic_turns(step, vocab))
            times.append(time.perf_counter() - t0)
            losses.append(stats["loss"])
        params = sum(p.numel() for p in trainer.model.parameters())
        torch.save({"step_s": statistics.median(times[1:]), "loss": losses[-1], "params": params,
                    "state_bytes": params * 4 * 4,  # weights, gradients, exp_avg, exp_avg_sq (fp32)
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024},
                   Path(out) / f"rank{rank}.pt")
    finally:
        leave()


def run(shape: str, backend: str, steps: int, root: Path) -> list[dict]:
    import torch
    import torch.multiprocessing as mp


    policy = root / f"policy-{shape}"
    if not policy.exists():
        write_policy(policy, SHAPES[shape])
    out = root / f"{shape}-{backend}"
    out.mkdir()
    world = 1 if BACKENDS[backend] is None else BACKENDS[backend][0] * BACKENDS[backend][1]
    mp.spawn(_rank, args=(backend, str(policy), str(out / "data"), f"file://{out}/rendezvous", steps, str(out)),
             nprocs=world, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="demo,100m")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    parser.add_argument("--out", type=Path, default=RESULTS / "train_backends.json")
    args = parser.parse_args()
    started = time.perf_counter()
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            for backend in args.backends.split(","):
                ranks = run(shape, backend, args.steps, Path(tmp))
                for r, rec in enumerate(ranks):
                    records.append({"shape": shape, "backend": backend, "rank": r, **rec})
                    rows.append((shape, backend, str(r), f"{rec['params'] / 1e6:.2f}",
                                 f"{rec['step_s']:.3f}", f"{rec['state_bytes'] / 2**20:.1f}",
                                 f"{rec['peak_rss_mb']:.0f}", f"{rec['loss']:+.6f}"))
    print_table("GRPO step per trainer rank (one thread per rank)",
                ["shape", "backend", "rank", "params (M)", "step s", "state MiB", "peak RSS MiB",
                 "last loss"], rows)
    write_result(args.out, "train_backends", args, started, ranks=records)


if __name__ == "__main__":
    main()
