"""The megatron-core backend: one rank of a TP x PP x DP trainer group running GRPO updates.

Every rank reads the same step's turns and builds the same micro-batches (executors/training/
batch.py); data-parallel replica d trains micro-batches d, d+dp, ...; the loss is core.grpo's,
weighted by each micro-batch's share of the whole step exactly as the Hugging Face backend
weights it, so the summed gradients equal its gradient. fp32 master weights and AdamW per rank
(elementwise, so a shard's update is the update's shard); the gradient norm is clipped over the
whole model. Checkpoints: executors/training/megatron_checkpoint.py.
"""
from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import torch
import torch.distributed as dist

from executors.training import megatron_checkpoint
from executors.training.batch import MicroBatch, micro_batches, pad, samples_from_turns
from executors.training.megatron_model import RankModel
from executors.training.pipeline import Stage
from core.config import RunConfig
from core.grpo import grpo_loss, tis_weights
from storage.shards.rules import infer_rule

_STATS = ("loss", "clip_fraction", "kl", "train_tokens", "stale_tokens", "tis_weight_sum")


def hf_tensors(policy_dir: Path) -> tuple[object, dict[str, torch.Tensor]]:
    """(config, full tensors) of a Hugging Face checkpoint, read from its safetensors files."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(policy_dir)
    files = sorted(Path(policy_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"policy model {policy_dir} has no safetensors: run `rose models build`")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(f))
    if getattr(cfg, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    return cfg, tensors


def token_logprobs(vocab_parallel_logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """core.grpo.token_logprobs for logits split over TP ranks by vocabulary (each rank holds
    its rows of the output layer): log p(ids[:, t] | ids[:, <t]) as [B, T-1], never gathering
    the full vocabulary."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = vocab_parallel_logits[:, :-1].float().contiguous()
    return -vocab_parallel_cross_entropy(logits, ids[:, 1:].contiguous())


class MegatronTrainer:
    """This rank's share of the policy, its optimizer and the GRPO update (same API as the
    Hugging Face Trainer: train_step, version, local weights to publish, checkpoints)."""

    def __init__(self, cfg: RunConfig, device: str = "cpu") -> None:
        policy_dir = cfg.models.policy_path()
        if not (policy_dir / "config.json").is_file():
            raise FileNotFoundError(f"policy model {policy_dir} missing: run `rose models build`")
        torch.manual_seed(cfg.train.seed)
        self.cfg, self.device = cfg, device
        self.hf_config, full = hf_tensors(policy_dir)
        self.rank = RankModel(self.hf_config, cfg.train.parallel, device)
        self.rank.load_hf(full)
        self.model = self.rank.model
        self.model.train()
        self.stage = Stage(self.model, int(self.hf_config.hidden_size), device)
        self.reference = None
        if cfg.train.kl_coef > 0:
            ref = RankModel(self.hf_config, cfg.train.parallel, device)
            ref.load_hf(full)
            self.reference = Stage(ref.model.eval().requires_grad_(False), self.stage.hidden, device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.lr,
                                           betas=(0.9, 0.999), weight_decay=0.0)
        self.pad_id = int(getattr(self.hf_config, "pad_token_id", None) or 0)
        self.version = 0
        self._replicated = {n for n, p in self.model.named_parameters() if self._is_replicated(n, p)}
        self.checkpoint_dir = cfg.run_dir() / "checkpoints"
        held = megatron_checkpoint.resume(self, self.checkpoint_dir)
        if held is not None:
            self.version = held

    def save_checkpoint(self) -> Path:
        """The group's checkpoint of this version (every rank calls it; any layout resumes it)."""
        return megatron_checkpoint.save(self, self.checkpoint_dir, self.cfg.train.keep_checkpoints)

    def _is_replicated(self, name: str, p: torch.Tensor) -> bool:
        module = type(self.model.get_submodule(name.rsplit(".", 1)[0])).__name__
        return infer_rule(name, tuple(p.shape), module, self.rank.config).kind == "replicated"

    # ---- weights ----
    def local_weights(self, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
        """This rank's shards under Hugging Face names (what its sharded publisher pushes)."""
        return self.rank.local_hf(dtype)

    def weights_bf16(self, shared: bool = False) -> dict[str, torch.Tensor]:
        """The Hugging Face Trainer's name for what a rank publishes: its bf16 shards (`shared`,
        the coder processes' shared memory, is for unsharded publishing only)."""
        return {n: t.contiguous() for n, t in self.local_weights(torch.bfloat16).items()}

    @property
    def layout_rank(self) -> tuple[int, int, int]:
        """(tp, pp, dp) rank: the publish layout's name for this rank."""
        return self.rank.tp_rank, self.rank.pp_rank, self.rank.dp_rank

    # ---- GRPO ----
    def _logprobs(self, stage: Stage, mb: MicroBatch) -> torch.Tensor | None:
        logits = stage.forward(mb)
        return None if logits is None else token_logprobs(logits, mb.ids)

    def train_step(self, turns: pa.Table) -> dict:
        """One GRPO update across the group; every rank returns the same stats."""
        t0 = time.perf_counter()
        train = self.cfg.train
        samples, n_traj = samples_from_turns(turns, self.version)
        mine = micro_batches(samples, train.micro_batch)[self.rank.dp_rank::train.parallel.dp]
        batches = [pad(b, self.pad_id).to(self.device) for b in mine]
        stats: dict[str, float] = defaultdict(float)
        last = self.stage.last
        old = [self._logprobs(self.stage, mb) for mb in batches]
        ref = ([self._logprobs(self.reference, mb) for mb in batches] if self.reference is not None
               else [None] * len(batches))
        tis = [None] * len(batches)
        if last:
            for i, mb in enumerate(batches):
                tis[i] = tis_weights(old[i], mb.rollout_logprobs, mb.stale, train.tis_cap)
                stats["stale_tokens"] += float((mb.stale.float() * mb.mask).sum())
                stats["tis_weight_sum"] += float((tis[i] * mb.mask * mb.stale.float()).sum())
        for _ in range(train.updates_per_step):
            self.optimizer.zero_grad(set_to_none=False)
            for mb, old_lp, ref_lp, w in zip(batches, old, ref, tis):
                share = mb.size / len(samples)

                def loss_fn(logits: torch.Tensor, mb=mb, old_lp=old_lp, ref_lp=ref_lp, w=w,
                            share=share) -> torch.Tensor:
                    loss, ls = grpo_loss(token_logprobs(logits, mb.ids), old_lp, mb.advantages, mb.mask,
                                         train.clip_eps, ref_lp, train.kl_coef, is_weights=w)
                    stats["loss"] += ls.loss * share
                    stats["clip_fraction"] += ls.clip_fraction * share
                    stats["kl"] += ls.kl * share
                    stats["train_tokens"] += ls.tokens
                    return loss * share

                self.stage.forward_backward(mb, loss_fn)
            if samples:
                self._reduce_grads()
                stats["grad_norm"] = self._clip_grads(train.max_grad_norm)
                self.optimizer.step()
        self.version += 1
        out = self._gather_stats(stats, len(samples))
        if out["stale_tokens"]:
            out["tis_mean_weight"] = out["tis_weight_sum"] / out["stale_tokens"]
        out.pop("tis_weight_sum", None)
        out.update(trajectories=n_traj, trained_trajectories=len(samples), version=self.version,
                   train_s=time.perf_counter() - t0)
        return out

    def _reduce_grads(self) -> None:
        """Sum gradients over data-parallel replicas, q/k norms over TP ranks (each sees only its
        own heads), and a tied embedding over the first and last pipeline stages."""
        from megatron.core import parallel_state as ps

        for name, p in self.model.named_parameters():
            if p.grad is None:  # a replica with no micro-batch this step still takes part
                p.grad = torch.zeros_like(p)
            if self.cfg.train.parallel.dp > 1:
                dist.all_reduce(p.grad, group=ps.get_data_parallel_group())
            if self.cfg.train.parallel.tp > 1 and ("q_layernorm" in name or "k_layernorm" in name):
                dist.all_reduce(p.grad, group=ps.get_tensor_model_parallel_group())
        if self.rank.tied and self.cfg.train.parallel.pp > 1 and (self.stage.first or self.stage.last):
            shared = self.model.shared_embedding_or_output_weight()
            dist.all_reduce(shared.grad, group=ps.get_embedding_group())

    def _clip_grads(self, max_norm: float) -> float:
        """torch's clip_grad_norm_ over the whole model: each element counted once (replicated
        tensors on TP rank 0, a tied embedding on the first stage)."""
        from megatron.core import parallel_state as ps

        # on the trainer's device: NCCL reduces CUDA tensors only
        squares = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, p in self.model.named_parameters():
            duplicate = (name in self._replicated and self.rank.tp_rank != 0) or (
                name == "output_layer.weight" and self.rank.tied and not self.stage.first)
            if not duplicate:
                squares += p.grad.detach().double().pow(2).sum()
        dist.all_reduce(squares, group=ps.get_model_parallel_group())
        norm = float(squares.sqrt())
        coef = min(1.0, max_norm / (norm + 1e-6))
        if coef < 1.0:
            for p in self.model.parameters():
                p.grad.mul_(coef)
        return norm

    def _gather_stats(self, stats: dict[str, float], n_samples: int) -> dict:
        """The loss-side stats live on the last stage's TP rank 0 of each replica: summed."""
        mine = self.stage.last and self.rank.tp_rank == 0
        vec = torch.tensor([stats.get(k, 0.0) if mine else 0.0 for k in _STATS], dtype=torch.float64,
                           device=self.device)
        dist.all_reduce(vec)
        out = dict(zip(_STATS, vec.tolist()))
        if n_samples:
            out["grad_norm"] = stats["grad_norm"]
        return out
