"""Short supervised warm-up of the policy on demonstrations (CPU torch).

Conversations are laid out with ChatTokens exactly as rollout lays them out, and the loss
covers the assistant replies (and their EOS) only: the model learns what to answer, not to
predict the environment.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from core.chat import ChatTokens
from rose.models.demos import Demo


@dataclass
class WarmupSpec:
    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(f"bad warm-up spec: {self}")


def encode_demo(chat: ChatTokens, demo: Demo) -> tuple[list[int], list[int]]:
    """(token ids, loss mask): one trajectory as rollout would build it."""
    ids = chat.system(demo.system)
    mask = [0] * len(ids)
    for obs, reply in demo.turns:
        prompt = chat.user_turn(obs)
        answer = chat.reply(reply)
        ids += prompt + answer + chat.assistant_end_ids
        mask += [0] * len(prompt) + [1] * len(answer) + [0] * len(chat.assistant_end_ids)
    return ids, mask


def _batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels. No attention mask is needed: with causal attention and
    padding only at the end, no real token ever attends to a pad."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (row, mask) in enumerate(rows):
        t = torch.tensor(row)
        ids[i, : len(row)] = t
        labels[i, : len(row)] = torch.where(torch.tensor(mask, dtype=torch.bool), t, -100)
    return ids, labels


def _batches(lengths: list[int], batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """One epoch of batches of similar lengths (less padding), in random order."""
    order = rng.permutation(len(lengths))
    chunk = batch_size * 16
    batches = []
    for c in range(0, len(order), chunk):
        part = sorted(order[c : c + chunk], key=lambda i: lengths[i])
        batches += [part[b : b + batch_size] for b in range(0, len(part), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def warmup(model: torch.nn.Module, chat: ChatTokens, demos: list[Demo], spec: WarmupSpec, seed: int) -> dict:
    """Train `model` (float32, in place) on `demos`; returns loss statistics."""
    rows = [encode_demo(chat, d) for d in demos]
    if not rows or spec.steps == 0:
        return {"steps": 0}
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < spec.warmup_steps:
            return spec.lr * (step + 1) / spec.warmup_steps
        frac = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        return spec.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))

    model.train()
    losses, t0 = [], time.perf_counter()
    lengths = [len(ids) for ids, _ in rows]
    queue: list[list[int]] = []
    for step in range(spec.steps):
        if not queue:
            queue = _batches(lengths, spec.batch_size, rng)
        ids, labels = _batch([rows[i] for i in queue.pop()], chat.pad_id)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    head = float(np.mean(losses[:10]))
    tail = float(np.mean(losses[-10:]))
    return {"steps": spec.steps, "loss_start": head, "loss_end": tail, "seconds": time.perf_counter() - t0}
