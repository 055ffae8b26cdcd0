"""Hugging Face Qwen2/Qwen3 <-> megatron-core GPT: parameter names and the two fused layouts.

megatron-core fuses Q, K and V into `linear_qkv`, its rows grouped per query group as
[q heads of the group, k, v], and gate/up into `linear_fc1` as [gate; up]. The same functions
convert full tensors (loading a checkpoint) and one tensor-parallel rank's local tensors
(publishing its shard): pass that rank's head and group counts. A hand-written map, because
neither maintained bridge runs on this stack (mbridge builds models with `.cuda()` and
Transformer Engine layer specs; megatron-bridge needs transformers < 5 and Transformer Engine);
tests/test_megatron_map.py checks it both ways bit-exact. Plain torch: no process group.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_MC_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
# per-layer parameters that are renamed only
_RENAMED = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}
_TOP = {"model.embed_tokens.weight": "embedding.word_embeddings.weight",
        "model.norm.weight": "decoder.final_layernorm.weight",
        "lm_head.weight": "output_layer.weight"}
_QKV = ("q_proj", "k_proj", "v_proj")


@dataclass(frozen=True)
class Heads:
    """Attention heads as one tensor-parallel rank holds them (tp=1: the whole model)."""

    heads: int
    groups: int
    head_dim: int

    def __post_init__(self) -> None:
        if min(self.heads, self.groups, self.head_dim) < 1 or self.heads % self.groups:
            raise ValueError(f"{self.heads} query heads do not form {self.groups} query groups")

    def local(self, tp: int) -> "Heads":
        if self.heads % tp or self.groups % tp:
            raise ValueError(f"tensor parallel {tp} must divide the {self.heads} attention heads "
                             f"and the {self.groups} key/value heads")
        return Heads(self.heads // tp, self.groups // tp, self.head_dim)


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, h: Heads) -> torch.Tensor:
    per = h.heads // h.groups
    rest = q.shape[1:]
    q = q.reshape(h.groups, per * h.head_dim, *rest)
    k, v = k.reshape(h.groups, h.head_dim, *rest), v.reshape(h.groups, h.head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest).contiguous()


def split_qkv(qkv: torch.Tensor, h: Heads) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    per = h.heads // h.groups
    rest = qkv.shape[1:]
    g = qkv.reshape(h.groups, (per + 2) * h.head_dim, *rest)
    q, k, v = torch.split(g, [per * h.head_dim, h.head_dim, h.head_dim], dim=1)
    return tuple(t.reshape(-1, *rest).contiguous() for t in (q, k, v))  # type: ignore[return-value]


def to_megatron(hf: dict[str, torch.Tensor], h: Heads, layer_offset: int = 0) -> dict[str, torch.Tensor]:
    """Hugging Face tensors (full or one rank's) -> megatron-core names and layouts; decoder
    layer i becomes local layer i - layer_offset (a pipeline stage numbers its own layers)."""
    out: dict[str, torch.Tensor] = {}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in hf.items():
        if name in _TOP:
            out[_TOP[name]] = t
        elif m := _HF_LAYER.match(name):
            layers.setdefault(int(m[1]), {})[m[2]] = t
        else:
            raise KeyError(f"no megatron-core name for Hugging Face parameter {name!r}")
    for i, p in sorted(layers.items()):
        pre = f"decoder.layers.{i - layer_offset}."
        for leaf in ("weight", "bias"):
            qkv = [p.pop(f"self_attn.{m}.{leaf}", None) for m in _QKV]
            if all(t is not None for t in qkv):
                out[pre + f"self_attention.linear_qkv.{leaf}"] = fuse_qkv(*qkv, h)
            elif any(t is not None for t in qkv):
                raise KeyError(f"layer {i}: q/k/v {leaf}s must come together")
        gate, up = p.pop("mlp.gate_proj.weight", None), p.pop("mlp.up_proj.weight", None)
        if (gate is None) != (up is None):
            raise KeyError(f"layer {i}: gate_proj and up_proj must come together")
        if gate is not None:
            out[pre + "mlp.linear_fc1.weight"] = torch.cat([gate, up]).contiguous()
        for leaf, t in p.items():
            if leaf not in _RENAMED:
                raise KeyError(f"no megatron-core name for model.layers.{i}.{leaf}")
            out[pre + _RENAMED[leaf]] = t
    return out


def to_hf(mcore: dict[str, torch.Tensor], h: Heads, layer_offset: int = 0,
          tied: bool = False) -> dict[str, torch.Tensor]:
    """megatron-core tensors (full or one rank's) -> Hugging Face names and layouts. With tied
    embeddings the output layer a last pipeline stage holds is exported as the embedding."""
    hf_top = {v: k for k, v in _TOP.items()}
    if tied:
        hf_top["output_layer.weight"] = "model.embed_tokens.weight"
    hf_layer = {v: k for k, v in _RENAMED.items()}
    out: dict[str, torch.Tensor] = {}
    for name, t in mcore.items():
        if name in hf_top:
            out[hf_top[name]] = t
            continue
        m = _MC_LAYER.match(name)
        if m is None:
            raise KeyError(f"no Hugging Face name for megatron-core parameter {name!r}")
        pre, leaf = f"model.layers.{int(m[1]) + layer_offset}.", m[2]
        if leaf.startswith("self_attention.linear_qkv."):
            kind = leaf.rsplit(".", 1)[1]
            for proj, part in zip(_QKV, split_qkv(t, h)):
                out[pre + f"self_attn.{proj}.{kind}"] = part
        elif leaf == "mlp.linear_fc1.weight":
            gate, up = torch.chunk(t, 2)
            out[pre + "mlp.gate_proj.weight"] = gate.contiguous()
            out[pre + "mlp.up_proj.weight"] = up.contiguous()
        elif leaf in hf_layer:
            out[pre + hf_layer[leaf]] = t
        else:
            raise KeyError(f"no Hugging Face name for megatron-core parameter {name!r}")
    return out
