"""The trainer: fp32 master weights + AdamW held across RL steps, GRPO updates, bf16 export.

`Trainer` is plain PyTorch (tests drive it directly); `TrainerPlugin` keeps one alive inside
the `train_gpu` Dask worker so the optimizer state survives between flow runs.
"""
from __future__ import annotations

import random
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from distributed import WorkerPlugin

from executors.training.batch import MicroBatch, micro_batches, pad, samples_from_turns
from core.config import RunConfig
from core.grpo import grpo_loss, tis_weights, token_logprobs
from storage.weights.tensor_arena import arena_copy


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    def __init__(self, cfg: RunConfig) -> None:
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        policy_dir = cfg.models.policy_path()
        if not (policy_dir / "config.json").is_file():
            raise FileNotFoundError(f"policy model {policy_dir} missing: run `rose models build`")
        seed_everything(cfg.train.seed)
        self.model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.lr,
                                           betas=(0.9, 0.999), weight_decay=0.0)
        self.reference = None
        if cfg.train.kl_coef > 0:
            self.reference = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
            self.reference.eval().requires_grad_(False)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.version = 0  # = number of completed train steps
        self.layout_rank = (0, 0, 0)  # (tp, pp, dp): one process holds the whole model
        self.checkpoint_dir = cfg.run_dir() / "checkpoints"
        self._resume()

    # ---- checkpoints ----
    def _resume(self) -> None:
        from storage.checkpoints import load_latest_checkpoint

        ckpt = load_latest_checkpoint(self.checkpoint_dir)
        if ckpt is None:
            return
        self.model.load_state_dict(ckpt.model_state, strict=False)
        self.optimizer.load_state_dict(ckpt.optimizer_state)
        self.version = int(ckpt.step)

    def save_checkpoint(self) -> Path:
        from storage.checkpoints import save_checkpoint

        state = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        return save_checkpoint(self.checkpoint_dir, self.version, state,
                               self.optimizer.state_dict(),
                               {"run": self.cfg.run_id, "version": self.version},
                               keep=self.cfg.train.keep_checkpoints)

    # ---- weights ----
    def weights_bf16(self, shared: bool = False) -> dict[str, torch.Tensor]:
        """What rollout engines load: HF names, bf16 (tied lm_head appears once, as embeddings).
        `shared`: converted straight into an arena in shared memory, where the publisher's
        coder processes read them (storage/weights/tensor_arena.py), not into fresh tensors
        (into those where shared memory has no room for them, said in the log)."""
        params = {n: p.detach() for n, p in self.model.named_parameters()}
        if shared and (held := arena_copy(params, torch.bfloat16)) is not None:
            return held
        return {n: p.to(torch.bfloat16).contiguous() for n, p in params.items()}

    # ---- GRPO ----
    def _logprobs(self, model, mb: MicroBatch) -> torch.Tensor:
        return token_logprobs(model(input_ids=mb.ids, attention_mask=mb.attn).logits, mb.ids)

    def train_step(self, turns: pa.Table) -> dict:
        """One GRPO update from a step's turn rows (with `advantage` filled by the reward task)."""
        t0 = time.perf_counter()
        samples, n_traj = samples_from_turns(turns, self.version)
        stats = defaultdict(float)
        batches = [pad(b, self.pad_id) for b in micro_batches(samples, self.cfg.train.micro_batch)]
        with torch.no_grad():
            old = [self._logprobs(self.model, mb) for mb in batches]
            ref = ([self._logprobs(self.reference, mb) for mb in batches]
                   if self.reference is not None else [None] * len(batches))
            # one correction for every turn: exactly 1 on tokens of the trainer's own version
            tis = []
            for mb, old_lp in zip(batches, old):
                tis.append(tis_weights(old_lp, mb.rollout_logprobs, mb.stale, self.cfg.train.tis_cap))
                stats["stale_tokens"] += float((mb.stale.float() * mb.mask).sum())
                stats["tis_weight_sum"] += float((tis[-1] * mb.mask * mb.stale.float()).sum())
        for _ in range(self.cfg.train.updates_per_step):
            self.optimizer.zero_grad(set_to_none=True)
            for mb, old_lp, ref_lp, w in zip(batches, old, ref, tis):
                logp = self._logprobs(self.model, mb)
                loss, ls = grpo_loss(logp, old_lp, mb.advantages, mb.mask, self.cfg.train.clip_eps,
                                     ref_lp, self.cfg.train.kl_coef, is_weights=w)
                share = mb.size / len(samples)
                (loss * share).backward()
                stats["loss"] += ls.loss * share
                stats["clip_fraction"] += ls.clip_fraction * share
                stats["kl"] += ls.kl * share
                stats["train_tokens"] += ls.tokens
            if samples:
                gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                    self.cfg.train.max_grad_norm)
                stats["grad_norm"] = float(gn)
                self.optimizer.step()
        self.version += 1
        if stats["stale_tokens"]:  # mean TIS weight over tokens of older versions
            stats["tis_mean_weight"] = stats["tis_weight_sum"] / stats["stale_tokens"]
        stats.pop("tis_weight_sum", None)
        stats.update(trajectories=n_traj, trained_trajectories=len(samples),
                     version=self.version, train_s=time.perf_counter() - t0)
        return dict(stats)


class TrainerPlugin(WorkerPlugin):
    """Keeps one Trainer per run alive on the `train_gpu` worker."""

    idempotent = True  # re-registering must not tear down the optimizer state

    def __init__(self, cfg: RunConfig) -> None:
        self.name = plugin_name(cfg.run_id)
        self.cfg_json = cfg.model_dump_json()
        self.trainer: Trainer | None = None

    def setup(self, worker) -> None:
        # a megatron rank builds its trainer when its group forms (executors/workers/train_group.py)
        megatron = RunConfig.model_validate_json(self.cfg_json).train.backend == "megatron"
        if "train_gpu" in worker.state.total_resources and not megatron:
            cfg = RunConfig.model_validate_json(self.cfg_json)
            torch.set_num_threads(cfg.train.threads)
            self.trainer = Trainer(cfg)

    def teardown(self, worker) -> None:
        self.trainer = None


def plugin_name(run_id: str) -> str:
    return f"rose-trainer-{run_id}"


def local_trainer(run_id: str) -> Trainer:
    """The Trainer of this run on the current Dask worker (call from a task pinned to it): a
    megatron group's rank here if this process is one, else the plugin's."""
    from distributed import get_worker

    from executors.workers.train_group import group_trainer, held_group

    if held_group(run_id) is not None:
        return group_trainer(run_id)
    plugin = get_worker().plugins.get(plugin_name(run_id))
    if plugin is None or plugin.trainer is None:
        raise RuntimeError(f"no trainer for run {run_id!r} on this worker: is it a train_gpu "
                           "worker and was TrainerPlugin registered?")
    return plugin.trainer


def trainer_version(cfg: RunConfig) -> int:
    """The policy version this worker's trainer of the run holds (submitted to it by name, so
    it lives in a module every worker imports: a deployment loads flow files by path)."""
    return local_trainer(cfg.run_id).version
