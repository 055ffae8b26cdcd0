"""Checkpoints of a megatron-core trainer group that any layout resumes.

Each model-parallel rank of data-parallel replica 0 writes its shard of the weights and of
AdamW's two moments under Hugging Face names and layouts (`shard-t<T>-p<P>.safetensors`), rank
0 the layout and the optimizer's step count (meta.json). A rank resuming under another TP/PP
reads, one parameter at a time, the saved shards holding it, assembles the full tensor
(storage/shards/plan.assemble) and cuts its own slice, as it does from the Hugging Face model.
megatron-core's own distributed checkpointing is not used: in megatron-core 0.16 its save
allocates on CUDA (the async writer's copy, the finalize's all-reduce) and places sharded
tensors on "cuda", so it cannot run on a CPU trainer. Committed like the Hugging Face
trainer's checkpoints (storage/checkpoints.py): written hidden, renamed into place by rank 0 once
every rank has written. Needs a directory every rank sees (one host, or a shared filesystem).
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import torch
import torch.distributed as dist

from storage.checkpoints import commit_partial, latest_of_format, new_partial
from storage.shards.layout import stages_of
from storage.shards.plan import assemble
from storage.shards.rules import infer_rule

FORMAT = "rose-megatron"
MOMENTS = ("exp_avg", "exp_avg_sq")


def _file(tp_rank: int, pp_rank: int) -> str:
    return f"shard-t{tp_rank}-p{pp_rank}.safetensors"


def save(trainer, root: Path, keep: int) -> Path:
    """Save the group's state as checkpoint `trainer.version` (called on every rank)."""
    from safetensors.torch import save_file

    rank = trainer.rank
    tmp = [str(new_partial(root, trainer.version)) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(tmp, src=0)
    path = Path(tmp[0])
    steps = {int(st["step"]) for st in trainer.optimizer.state.values() if "step" in st}
    if rank.dp_rank == 0:
        params = dict(trainer.model.named_parameters())
        out = {f"param/{n}": t for n, t in rank.local_hf(None).items()}
        for moment in MOMENTS:
            held = {n: trainer.optimizer.state[p].get(moment, torch.zeros_like(p)).detach()
                    for n, p in params.items()}
            out.update({f"{moment}/{n}": t for n, t in rank.local_hf(None, held).items()})
        save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in out.items()},
                  str(path / _file(rank.tp_rank, rank.pp_rank)))
    dist.barrier()
    final = [None]
    if dist.get_rank() == 0:
        par = trainer.cfg.train.parallel
        info = {"format": FORMAT, "step": trainer.version, "saved_at": time.time(),
                "meta": {"run": trainer.cfg.run_id, "version": trainer.version,
                         "optimizer_steps": max(steps, default=0),
                         "layout": {"tp": par.tp, "pp": par.pp, "dp": par.dp},
                         "num_layers": int(trainer.hf_config.num_hidden_layers),
                         "tied": rank.tied}}
        final = [str(commit_partial(path, trainer.version, info, keep))]
    dist.broadcast_object_list(final, src=0)
    return Path(final[0])


def _full(shards: dict, meta: dict, names: list[str], prefix: str, hf_config) -> dict[str, torch.Tensor]:
    """Full tensors of `names` (under `prefix`) assembled from the saved shards holding them
    (`shards`: (tp, pp) -> the open file)."""
    lay = meta["layout"]
    out = {}
    for name in names:
        stage = stages_of(name, meta["num_layers"], lay["pp"], meta["tied"])[0]
        parts = [shards[t, stage].get_tensor(f"{prefix}/{name}") for t in range(lay["tp"])]
        rule = infer_rule(name, tuple(parts[0].shape), None, hf_config)
        shape = list(parts[0].shape)
        if rule.dim is not None:  # megatron splits evenly
            shape[rule.dim] *= lay["tp"]
        out[name] = assemble(parts, rule, shape)
    return out


def resume(trainer, root: Path) -> int | None:
    """Load the newest checkpoint under root into the trainer, whatever layout saved it; the
    version it holds, or None when there is none (called on every rank)."""
    latest = latest_of_format(root, FORMAT)
    if latest is None:
        return None
    step, path, info = latest
    from safetensors import safe_open

    meta, rank = info["meta"], trainer.rank
    names = rank.hf_names()
    params = dict(trainer.model.named_parameters())
    lay = meta["layout"]
    with ExitStack() as files, torch.no_grad():
        shards = {(t, p): files.enter_context(safe_open(str(path / _file(t, p)), "pt"))
                  for t in range(lay["tp"]) for p in range(lay["pp"])}
        for name, t in rank.local_megatron(_full(shards, meta, names, "param", trainer.hf_config)).items():
            params[name].copy_(t)
        moments = {m: rank.local_megatron(_full(shards, meta, names, m, trainer.hf_config)) for m in MOMENTS}
    if meta["optimizer_steps"]:
        for name, p in params.items():
            # moments beside their parameter (read on the CPU); the step count stays on the CPU, as AdamW keeps it
            trainer.optimizer.state[p] = {"step": torch.tensor(float(meta["optimizer_steps"])),
                                          **{m: moments[m][name].to(p.device, copy=True) for m in MOMENTS}}
    return step
