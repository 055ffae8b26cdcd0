"""GRPO: group-normalised advantages and the clipped policy-gradient loss.

Plain tensor math, no model or engine inside, so tests check it against hand-computed values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """rewards [groups, group_size] -> (r - mean_g) / (std_g + eps), std unbiased (ddof=1).

    A group whose rewards are all equal carries no signal: its advantages are exactly 0.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, group_size>=2], got {tuple(rewards.shape)}")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    return (rewards - mean) / (std + eps)


def assemble_trajectory(turns: list[tuple[list[int], list[int]]]) -> tuple[list[int], list[int]]:
    """Turns (prompt_ids, response_ids) -> the full token sequence and its loss mask.

    Each turn's prompt extends the previous turn's prompt + response (rollout appends ids,
    never re-tokenizes), so the last turn's prompt + response holds the whole trajectory and
    the mask is 1 exactly on model-generated tokens.
    """
    if not turns:
        raise ValueError("a trajectory needs at least one turn")
    mask: list[int] = []
    prev_end: list[int] = []
    for i, (prompt, response) in enumerate(turns):
        if prompt[: len(prev_end)] != prev_end:
            raise ValueError(f"turn {i}: prompt does not extend the previous turn's tokens")
        mask.extend([0] * (len(prompt) - len(mask)))
        mask.extend([1] * len(response))
        prev_end = list(prompt) + list(response)
    return prev_end, mask


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits [B, T, V] for ids [B, T] -> log p(ids[:, t] | ids[:, <t]) as [B, T-1]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


@dataclass
class LossStats:
    loss: float
    clip_fraction: float
    kl: float
    tokens: int


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, clip_eps: float = 0.2, ref_logp: torch.Tensor | None = None,
              kl_coef: float = 0.0) -> tuple[torch.Tensor, LossStats]:
    """Clipped surrogate over generated tokens only, averaged per sequence then over sequences.

    logp/old_logp/ref_logp/mask: [B, T]; advantages: [B]. KL uses the k3 estimator
    exp(ref - logp) - (ref - logp) - 1, which is >= 0 and unbiased for KL(pi || ref).
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(per_token)
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_coef * kl
    tokens_per_seq = mask.sum(dim=1).clamp(min=1)
    loss = ((per_token * mask).sum(dim=1) / tokens_per_seq).mean()
    total = mask.sum().clamp(min=1)
    clip_frac = (((ratio - 1).abs() > clip_eps).to(logp.dtype) * mask).sum() / total
    stats = LossStats(float(loss.detach()), float(clip_frac), float((kl * mask).sum() / total),
                      int(mask.sum()))
    return loss, stats
