"""One trainer group: torch.distributed (gloo on CPU, NCCL on CUDA) and megatron-core's TP/PP/DP
groups over it, plus the places megatron-core assumes CUDA at run time (its scratch buffer, the RNG tracker),
made to run on a CPU trainer (the model's own: RankModel).

The group is joined at a rendezvous the caller agrees on, a torch init_method URL: the stack's
trainer workers agree on `tcp://host:port` through the Dask scheduler
(executors/workers/train_group.py); ranks that share a filesystem may meet at `file:///path`,
which needs no port.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from core.config import TrainParallel


def join(rank: int, par: TrainParallel, rendezvous: str, device: str = "cpu",
         timeout_s: float = 120.0) -> None:
    """Join the trainer group at `rendezvous` (`tcp://host:port` or `file:///path`) as `rank` of
    par.world and build megatron's parallel groups."""
    if not rendezvous.startswith(("tcp://", "file://")):
        raise ValueError(f"trainer group rendezvous {rendezvous!r}: expected tcp://host:port or file:///path")
    from megatron.core import parallel_state as ps

    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a torch.distributed group")
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=rendezvous, rank=rank,
                            world_size=par.world, timeout=timedelta(seconds=timeout_s))
    ps.initialize_model_parallel(tensor_model_parallel_size=par.tp,
                                 pipeline_model_parallel_size=par.pp)
    from megatron.core.tensor_parallel import random as mrandom

    if device == "cpu":
        _cpu_buffers(ps)
        # dropout is 0 (GRPO on a policy): no CUDA RNG state needed, forks are no-ops
        mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    else:
        mrandom.model_parallel_cuda_manual_seed(1234)


def leave() -> None:
    """Destroy megatron's groups and the process group (a rank restarting joins afresh)."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def _cpu_buffers(ps) -> None:
    from megatron.core.utils import GlobalMemoryBuffer

    class HostBuffer(GlobalMemoryBuffer):
        """megatron-core's scratch buffer allocates on the current CUDA device: here, host memory."""

        def get_tensor(self, tensor_shape, dtype, name, mem_alloc_context=None):
            return torch.empty(tensor_shape, dtype=dtype)

    ps._GLOBAL_MEMORY_BUFFER = HostBuffer()

