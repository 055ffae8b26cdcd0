"""Forward and backward of one micro-batch through the pipeline stages, over torch.distributed.

One micro-batch at a time along the pipe (stage p receives p-1's activations, sends its own to
p+1; gradients flow back the same way): simple and exact, not overlapped. megatron-core's own
schedules allocate on CUDA and so cannot run on a CPU trainer; the paper's layouts use PP=1.
Every rank builds the same micro-batches, so activation shapes need no exchange.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from executors.training.batch import MicroBatch


def causal_mask(length: int, device: torch.device | str) -> torch.Tensor:
    """megatron-core's attention mask: True where a position may not attend (the future). With
    right padding the causal mask alone is exact for every real token."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), 1)[None, None]


class Stage:
    """This rank's stage of the pipeline: its model, neighbours and the hidden size sent."""

    def __init__(self, model: torch.nn.Module, hidden: int, device: str = "cpu") -> None:
        from megatron.core import parallel_state as ps

        self.model, self.hidden, self.device = model, hidden, torch.device(device)
        self.first = ps.is_pipeline_first_stage()
        self.last = ps.is_pipeline_last_stage()
        self.prev = None if self.first else ps.get_pipeline_model_parallel_prev_rank()
        self.next = None if self.last else ps.get_pipeline_model_parallel_next_rank()
        self.dtype = next(model.parameters()).dtype

    def _forward(self, mb: MicroBatch, grad: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
        b, t = mb.ids.shape
        received = None
        if not self.first:
            received = torch.empty((t, b, self.hidden), dtype=self.dtype, device=self.device)
            dist.recv(received, self.prev)
            received.requires_grad_(grad)
        self.model.set_input_tensor(received)
        ids = mb.ids
        positions = torch.arange(t, device=self.device).unsqueeze(0).expand(b, -1)
        # on CUDA: bf16 compute over the fp32 master weights; activations cross stages in fp32
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            out = self.model(ids, positions, causal_mask(t, self.device))
        if not self.last:
            out = out.to(self.dtype)
            dist.send(out.detach().contiguous(), self.next)
        return received, out

    def forward(self, mb: MicroBatch) -> torch.Tensor | None:
        """Logits [B, T, V] on the last stage, None elsewhere (no graph kept)."""
        with torch.no_grad():
            _, out = self._forward(mb, grad=False)
        return out if self.last else None

    def forward_backward(self, mb: MicroBatch,
                         loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Forward, then backward of loss_fn(logits) (evaluated on the last stage only)."""
        received, out = self._forward(mb, grad=True)
        if self.last:
            loss_fn(out).backward()
        else:
            upstream = torch.empty_like(out)
            dist.recv(upstream, self.next)
            torch.autograd.backward(out, upstream)
        if received is not None:
            dist.send(received.grad.contiguous(), self.prev)
