"""A step's turns as training samples and padded micro-batches: one implementation for both
trainer backends, so they train on exactly the same tensors."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa
import torch

from core.grpo import assemble_trajectory, behaviour_tokens

# (token ids, loss mask, advantage, rollout logprob per token, stale per token)
Sample = tuple[list[int], list[int], float, list[float], list[bool]]


@dataclass
class MicroBatch:
    """Padded tensors of a micro-batch; per-token ones aligned with next-token log-probs."""

    ids: torch.Tensor  # [B, T]
    attn: torch.Tensor  # [B, T], 1 on real tokens
    mask: torch.Tensor  # [B, T-1], 1 on generated tokens
    advantages: torch.Tensor  # [B]
    rollout_logprobs: torch.Tensor  # [B, T-1]
    stale: torch.Tensor  # [B, T-1]
    size: int

    def to(self, device: str | torch.device) -> "MicroBatch":
        """The same micro-batch on `device` (moved once, before its forward passes)."""
        return MicroBatch(*(t.to(device) for t in (self.ids, self.attn, self.mask, self.advantages,
                                                   self.rollout_logprobs, self.stale)), self.size)


def samples_from_turns(turns: pa.Table, version: int) -> tuple[list[Sample], int]:
    """(samples sorted by length, trajectories seen) from a step's turn rows (with `advantage`
    filled by the reward task). Zero-advantage trajectories give no gradient and are left out;
    turns of the trainer's own `version` are on-policy (the trainer holds s-1 at step s)."""
    by_traj: dict[str, list[dict]] = defaultdict(list)
    for row in turns.select(["trajectory", "turn", "prompt_ids", "response_ids",
                             "advantage", "logprobs", "policy_version"]).to_pylist():
        by_traj[row["trajectory"]].append(row)
    samples: list[Sample] = []
    for tid in sorted(by_traj):
        rows = sorted(by_traj[tid], key=lambda r: r["turn"])
        adv = rows[0]["advantage"]
        if adv is None:
            raise ValueError(f"trajectory {tid} has no advantage: run the reward task first")
        seq, mask = assemble_trajectory([(r["prompt_ids"], r["response_ids"]) for r in rows])
        blp, stale = behaviour_tokens([(r["prompt_ids"], r["response_ids"], r["logprobs"],
                                        r["policy_version"]) for r in rows], version)
        if adv != 0.0 and sum(mask) > 0:
            samples.append((seq, mask, float(adv), blp, stale))
    samples.sort(key=lambda s: len(s[0]))  # similar lengths per micro-batch: less padding
    return samples, len(by_traj)


def micro_batches(samples: list[Sample], micro: int) -> list[list[Sample]]:
    return [samples[i: i + micro] for i in range(0, len(samples), micro)]


def pad(batch: list[Sample], pad_id: int) -> MicroBatch:
    longest = max(len(s[0]) for s in batch)
    n = len(batch)
    ids = torch.full((n, longest), pad_id, dtype=torch.long)
    mask = torch.zeros((n, longest), dtype=torch.float32)
    attn = torch.zeros((n, longest), dtype=torch.long)
    rollout_lp = torch.zeros((n, longest), dtype=torch.float32)
    stale = torch.zeros((n, longest), dtype=torch.bool)
    for i, (seq, m, _, blp, st) in enumerate(batch):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
        attn[i, : len(seq)] = 1
        rollout_lp[i, : len(blp)] = torch.tensor(blp, dtype=torch.float32)
        stale[i, : len(st)] = torch.tensor(st, dtype=torch.bool)
    adv = torch.tensor([s[2] for s in batch], dtype=torch.float32)
    return MicroBatch(ids, attn, mask[:, 1:], adv, rollout_lp[:, 1:], stale[:, 1:], n)
