"""Read-only: the weights a vLLM engine computes with, under the checkpoint's (HF) names.

What a receiver holds or digests is not proof of what the engine runs: vLLM fuses projections
(q/k/v into qkv_proj, gate/up into gate_up_proj) and, on CPU, packs every linear weight into a
private GEMM copy at load (oneDNN / sgl), leaving the module's `weight` empty; the LM head is
such a copy too, also when tied to the embeddings (the copy an in-place reload once left stale,
executors/engine/vllm_engine.py `_repack_output_heads`). So a packed layer is read by running
its own GEMM on an identity matrix: each output element is one weight times 1.0 plus exact
zeros, accumulated in at least fp32, so it comes back bit for bit. Fused weights are split back
into the checkpoint's parts. The LM head is reported as `lm_head.weight`, tied or not.
"""
from __future__ import annotations

import torch

HEAD = "lm_head.weight"


def engine_weights(engine) -> dict[str, torch.Tensor]:
    """Every weight of `engine`'s model (this worker's tensor-parallel shard) as it computes
    with them. Call it between engine steps (EngineLoop.call: the owner thread)."""
    return engine.collective_rpc(_engine_weights)[0]


def _engine_weights(worker_self) -> dict[str, torch.Tensor]:
    model = worker_self.model_runner.model
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    head = getattr(model, "lm_head", None)
    out: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for mname, module in model.named_modules():
            gemm = getattr(module, "cpu_linear", None)
            rows = getattr(module, "org_vocab_size", None)  # an embedding's vocab, unpadded
            if module is head and gemm is not None:  # the head's GEMM copy, tied or not
                out[HEAD] = _probe(module, gemm, module.embedding_dim)[:rows]
            for pname, param in module.named_parameters(recurse=False):
                name = f"{mname}.{pname}" if mname else pname
                if rows is not None:  # embedding table (or an untied head's own parameter)
                    if name != HEAD or gemm is None:
                        out[name] = param.detach()[:rows].clone()
                elif pname == "weight" and gemm is not None:  # a linear layer: packed on CPU
                    out.update(_split(name, _probe(module, gemm, module.input_size_per_partition),
                                      module, packed))
                else:
                    out.update(_split(name, param.detach().clone(), module, packed))
    return out


def _probe(module, gemm, in_features: int) -> torch.Tensor:
    """The [out, in] weight the layer's GEMM multiplies by: gemm(I) = I @ W^T."""
    param = module.weight
    eye = torch.eye(in_features, dtype=param.dtype, device=param.device)
    return gemm(eye, param, None).t().contiguous()


def _split(name: str, value: torch.Tensor, module, packed: dict[str, list[str]]
           ) -> dict[str, torch.Tensor]:
    """A fused weight or bias back into its checkpoint parts (qkv_proj -> q/k/v_proj ...)."""
    prefix, leaf, kind = name.rsplit(".", 2) if name.count(".") >= 2 else ("", *name.split(".", 1))
    parts = packed.get(leaf)
    sizes = getattr(module, "output_sizes", None)
    if not parts or sizes is None or len(parts) != len(sizes):
        return {name: value}
    tp = getattr(module, "tp_size", 1) or 1
    chunks = torch.split(value, [s // tp for s in sizes], dim=0)
    return {f"{prefix}.{part}.{kind}" if prefix else f"{part}.{kind}": c.contiguous()
            for part, c in zip(parts, chunks)}
