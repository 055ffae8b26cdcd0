"""Trainer ranks for the megatron tests, run in processes of their own (torch.multiprocessing):
each joins a gloo group, trains, and saves what the test compares under `out`; `runs_rank` runs
several such runs in turn in one process; `launch` starts ranks with their imports done once."""
from __future__ import annotations

import os
from typing import Callable

import pyarrow as pa
import torch


def tiny_policy(path, layers: int = 2, seed: int = 0):
    """A Qwen3 policy small enough for four layouts in a test, shaped for TP=2 and PP=2."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, intermediate_size=64,
                      tie_word_embeddings=True, pad_token_id=0)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


def step_turns(step: int, trainer_version: int, n: int = 6) -> pa.Table:
    """A step's turns: n two-turn trajectories of different lengths, seeded by the step; the
    second turn of every other trajectory one version behind (so TIS takes part)."""
    gen = torch.Generator().manual_seed(100 + step)
    rows = []
    for t in range(n):
        prompt = torch.randint(1, 64, (3 + t % 3,), generator=gen).tolist()
        first = torch.randint(1, 64, (2 + t % 4,), generator=gen).tolist()
        second_prompt = prompt + first + torch.randint(1, 64, (2,), generator=gen).tolist()
        second = torch.randint(1, 64, (1 + t % 3,), generator=gen).tolist()
        adv = float(torch.randn((), generator=gen)) or 0.5
        lp = lambda k: (-1.0 - torch.rand(k, generator=gen)).tolist()  # noqa: E731
        rows += [{"trajectory": f"s{step}-t{t}", "turn": 0, "prompt_ids": prompt, "response_ids": first,
                  "advantage": adv, "logprobs": lp(len(first)), "policy_version": trainer_version},
                 {"trajectory": f"s{step}-t{t}", "turn": 1, "prompt_ids": second_prompt,
                  "response_ids": second, "advantage": adv, "logprobs": lp(len(second)),
                  "policy_version": trainer_version - (t % 2)}]
    return pa.Table.from_pylist(rows)


def train_rank(rank: int, cfg_json: str, rendezvous: str, out: str, steps: int) -> None:
    from executors.training.megatron_trainer import MegatronTrainer
    from executors.training.process_group import join, leave
    from core.config import RunConfig

    cfg = RunConfig.model_validate_json(cfg_json)
    os.environ["ROSE_DATA_DIR"] = os.path.join(out, "data")
    torch.set_num_threads(1)
    join(rank, cfg.train.parallel, rendezvous)
    try:
        trainer = MegatronTrainer(cfg)
        stats = [trainer.train_step(step_turns(s, trainer.version)) for s in range(1, steps + 1)]
        torch.save({"stats": stats, "weights": trainer.local_weights(torch.float32),
                    "rank": trainer.layout_rank}, os.path.join(out, f"rank{rank}.pt"))
    finally:
        leave()


def checkpoint_rank(rank: int, cfg_json: str, rendezvous: str, out: str, steps: int) -> None:
    """Train `steps` (resuming whatever checkpoint the run holds), checkpoint, save stats."""
    from executors.training.megatron_trainer import MegatronTrainer
    from executors.training.process_group import join, leave
    from core.config import RunConfig

    cfg = RunConfig.model_validate_json(cfg_json)
    torch.set_num_threads(1)
    join(rank, cfg.train.parallel, rendezvous)
    try:
        trainer = MegatronTrainer(cfg)
        start = trainer.version
        stats = []
        for s in range(start + 1, start + steps + 1):
            stats.append(trainer.train_step(step_turns(s, trainer.version)))
            trainer.save_checkpoint()
        torch.save({"start": start, "stats": stats, "weights": trainer.local_weights(torch.float32),
                    "rank": trainer.layout_rank},
                   os.path.join(out, f"rank{rank}.pt"))
    finally:
        leave()


def runs_rank(rank: int, runs: list[tuple[str, str, int, str, int, str]]) -> None:
    """(rank function name, config, rendezvous, out, steps, ROSE_DATA_DIR) runs in turn, each joining
    and leaving a group of its config's layout; a rank outside a run's world sits it out."""
    from core.config import RunConfig

    for fn, cfg_json, rendezvous, out, steps, data_dir in runs:
        if rank < RunConfig.model_validate_json(cfg_json).train.parallel.world:
            os.environ["ROSE_DATA_DIR"] = data_dir
            {"train": train_rank, "checkpoint": checkpoint_rank}[fn](rank, cfg_json, rendezvous, out, steps)


# what every rank imports: the forkserver imports it once for the session
_PRELOAD = ["torch", "torch.distributed", "transformers", "megatron.core", "megatron.core.tensor_parallel",
            "executors.training.megatron_trainer"]


def launch(fn: Callable[..., None], args: tuple, nprocs: int) -> None:
    """torch.multiprocessing.spawn's ranks (fn(rank, *args), joined, a rank's error raised here),
    forked from multiprocessing's forkserver with the ranks' imports done once in it: a spawned
    rank pays them at every launch (~10 s on 2 cores), and a forked pytest process would carry
    its threads' held locks into the ranks. The server keeps the environment it started with:
    a rank takes what it needs from its arguments."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(_PRELOAD)  # before it starts
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
