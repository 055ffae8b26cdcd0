"""Shard rules: how one parameter is split across tensor-parallel ranks.

A rule describes the *full* tensor in Hugging Face order (fused QKV = [Q; K; V] rows, fused
gate/up = [gate; up] rows) and how a TP rank's local tensor is cut from it. Inference works from
Hugging Face Qwen2/Qwen3 names and from megatron-core names, module types and the parameter
attributes megatron sets (`tensor_model_parallel`, `partition_dim`, `partition_stride`).
Plain Python: no engine, no network.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["replicated", "column", "row", "vocab"]
Layout = Literal["plain", "gated", "qkv_grouped"]
_DIM_OF_KIND = {"replicated": None, "column": 0, "row": 1, "vocab": 0}


@dataclass(frozen=True)
class ShardRule:
    """How a parameter is split over TP ranks.

    kind/dim: replicated (dim None), column and vocab (dim 0), row (dim 1; 1-D tensors cannot be).
    layout: plain (one contiguous range per rank), gated (`stride` chunks: rank r holds chunk r of
    each of gate and up), qkv_grouped (megatron linear_qkv: rows grouped per query group as
    [q heads, k, v], split contiguously in that order; needs num_heads, num_groups, head_dim).
    units: indivisible units along dim (attention heads); a split must not cut one. With
    replicate_units (vLLM KV heads) a TP larger than `units` gives each rank one whole unit.
    vocab_pad: per-rank vocab rows are rounded up to this multiple (padding rows are not data).
    """

    kind: Kind
    dim: int | None = None
    layout: Layout = "plain"
    stride: int = 1
    units: int = 0
    replicate_units: bool = False
    num_heads: int = 0
    num_groups: int = 0
    head_dim: int = 0
    vocab_pad: int = 1

    def __post_init__(self) -> None:
        if self.kind not in _DIM_OF_KIND:
            raise ValueError(f"unknown shard kind {self.kind!r}")
        if self.dim != _DIM_OF_KIND[self.kind]:
            raise ValueError(f"{self.kind} rule must shard dim {_DIM_OF_KIND[self.kind]}, got {self.dim}")
        if self.layout not in ("plain", "gated", "qkv_grouped"):
            raise ValueError(f"unknown shard layout {self.layout!r}")
        if self.layout != "plain" and self.kind != "column":
            raise ValueError(f"layout {self.layout} needs a column rule, got {self.kind}")
        if (self.layout == "gated") != (self.stride > 1) or self.stride < 1:
            raise ValueError(f"gated layout needs stride > 1 and plain stride 1, got {self.layout}/{self.stride}")
        if self.layout == "qkv_grouped":
            if min(self.num_heads, self.num_groups, self.head_dim) <= 0:
                raise ValueError("qkv_grouped rule needs num_heads, num_groups and head_dim > 0")
            if self.num_heads % self.num_groups:
                raise ValueError(f"num_heads {self.num_heads} not divisible by query groups {self.num_groups}")
        if self.units < 0 or self.vocab_pad < 1:
            raise ValueError(f"units must be >= 0 and vocab_pad >= 1, got {self.units}/{self.vocab_pad}")


REPLICATED = ShardRule("replicated")


def _cfg(cfg: Any, *names: str, default: Any = None) -> Any:
    """First attribute (or mapping key) of cfg among names; HF and megatron spell them differently."""
    for name in names:
        value = cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)
        if value is not None:
            return value
    return default


def _heads(cfg: Any) -> tuple[int, int, int]:
    """(query heads, kv heads / query groups, head dim) from an HF or megatron config."""
    if cfg is None:
        raise ValueError("fused QKV needs the model config (heads, kv heads, head dim)")
    heads = int(_cfg(cfg, "num_attention_heads", default=0))
    groups = int(_cfg(cfg, "num_query_groups", "num_key_value_heads", default=heads))
    hidden = int(_cfg(cfg, "hidden_size", default=0))
    head_dim = int(_cfg(cfg, "kv_channels", "head_dim", default=hidden // heads if heads else 0))
    if min(heads, groups, head_dim) <= 0:
        raise ValueError(f"config lacks attention head counts: heads={heads} groups={groups} head_dim={head_dim}")
    return heads, groups, head_dim


def _gated(cfg: Any) -> bool:
    # Qwen2/Qwen3 MLPs are always SwiGLU; a megatron config says so explicitly.
    return bool(_cfg(cfg, "gated_linear_unit", default=True)) if cfg is not None else True


_LEAF = re.compile(r"(?:^|\.)(?P<mod>[A-Za-z0-9_]+)\.(?P<leaf>[A-Za-z0-9_]+)$")


def _rule_from_name(name: str, cfg: Any) -> ShardRule | None:
    """Rule from the parameter name alone (HF Qwen2/Qwen3 and megatron-core GPT names)."""
    m = _LEAF.search(name)
    if m is None:
        return None
    mod, leaf = m["mod"], m["leaf"]
    if leaf.startswith("layer_norm_") or "norm" in mod:  # RMSNorm / fused-norm weights
        return REPLICATED
    if mod in ("embed_tokens", "word_embeddings", "lm_head", "output_layer") and leaf == "weight":
        return ShardRule("vocab", 0)
    if leaf not in ("weight", "bias"):
        return None
    if mod in ("o_proj", "down_proj", "linear_proj", "linear_fc2"):
        if leaf == "bias":  # added after the all-reduce: every rank holds all of it
            return REPLICATED
        units = _heads(cfg)[0] if mod in ("o_proj", "linear_proj") and cfg is not None else 0
        return ShardRule("row", 1, units=units)
    if mod == "q_proj":
        return ShardRule("column", 0, units=_heads(cfg)[0] if cfg is not None else 0)
    if mod in ("k_proj", "v_proj"):
        # vLLM gives each rank one whole KV head (replicated) when TP exceeds the KV heads.
        groups = _heads(cfg)[1] if cfg is not None else 0
        return ShardRule("column", 0, units=groups, replicate_units=groups > 0)
    if mod in ("gate_proj", "up_proj"):
        return ShardRule("column", 0)
    if mod == "linear_qkv":
        heads, groups, head_dim = _heads(cfg)
        return ShardRule("column", 0, "qkv_grouped", num_heads=heads, num_groups=groups, head_dim=head_dim)
    if mod in ("linear_fc1", "gate_up_proj"):
        return ShardRule("column", 0, "gated", stride=2) if _gated(cfg) else ShardRule("column", 0)
    return None


def _rule_from_module(name: str, module_type: str, attrs: Mapping[str, Any] | None) -> ShardRule | None:
    """Kind and dim from megatron attributes, else from the module type; None if neither says."""
    leaf = name.rsplit(".", 1)[-1]
    if attrs is not None:
        if leaf.startswith("layer_norm_"):
            return REPLICATED
        if not attrs.get("tensor_model_parallel", False):
            return REPLICATED  # megatron's default for parameters without TP attributes
        dim, stride = int(attrs.get("partition_dim", 0)), int(attrs.get("partition_stride", 1))
        if dim not in (0, 1):
            raise ValueError(f"{name}: unsupported partition_dim {dim}")
        kind: Kind = "row" if dim == 1 else ("vocab" if "Embedding" in module_type else "column")
        layout: Layout = "gated" if stride > 1 else "plain"
        return ShardRule(kind, dim, layout, stride=stride)
    if "Norm" in module_type:
        return REPLICATED
    if module_type.endswith("VocabParallelEmbedding"):
        return ShardRule("vocab", 0)
    if module_type.endswith("ColumnParallelLinear"):
        return REPLICATED if leaf.startswith("layer_norm_") else ShardRule("column", 0)
    if module_type.endswith("RowParallelLinear"):
        return ShardRule("row", 1) if leaf == "weight" else REPLICATED
    return None


def _merge(name: str, by_name: ShardRule | None, by_module: ShardRule | None) -> ShardRule | None:
    """The name refines layout/units; the module (attributes) is authoritative about the dim."""
    if by_module is None or by_name is None:
        return by_module or by_name
    if by_module.dim != by_name.dim:
        raise ValueError(
            f"{name}: module says {by_module.kind} (dim {by_module.dim}) but the name implies "
            f"{by_name.kind} (dim {by_name.dim})"
        )
    if by_module.layout == "gated" and by_name.layout == "plain":
        return by_module  # e.g. an unknown name with partition_stride=2
    return by_name


def infer_rule(
    name: str,
    shape: tuple[int, ...] | Any,
    module_type: str | None = None,
    model_cfg: Any = None,
    attrs: Mapping[str, Any] | None = None,
) -> ShardRule:
    """Shard rule for one parameter.

    name: HF (`model.layers.0.self_attn.q_proj.weight`) or megatron-core
    (`decoder.layers.0.self_attention.linear_qkv.weight`) parameter name. shape: its shape
    (only the rank matters here). module_type: class name of the owning module, if known.
    model_cfg: HF config or megatron TransformerConfig (or a dict), needed for fused QKV and heads.
    attrs: megatron TP attributes of the parameter, if known (see `megatron_attrs`).
    """
    ndim = len(tuple(shape))
    by_name = _rule_from_name(name, model_cfg)
    by_module = _rule_from_module(name, module_type or "", attrs) if (module_type or attrs is not None) else None
    rule = _merge(name, by_name, by_module)
    if rule is None:
        raise ValueError(
            f"cannot infer a shard rule for {name!r} (shape {tuple(shape)}, module {module_type!r}): "
            "unknown name and no TP attributes"
        )
    if ndim == 0 and rule.kind != "replicated":
        raise ValueError(f"{name}: scalar parameter cannot be {rule.kind}-sharded")
    if rule.dim is not None and rule.dim >= ndim:
        if rule.kind == "row":  # a 1-D parameter of a row-parallel layer is its (replicated) bias
            return REPLICATED
        raise ValueError(f"{name}: {rule.kind} rule shards dim {rule.dim} of a {ndim}-D tensor")
    return rule


def megatron_attrs(param: Any) -> dict[str, Any]:
    """The TP attributes megatron-core sets on a parameter (defaults when absent)."""
    return {
        "tensor_model_parallel": bool(getattr(param, "tensor_model_parallel", False)),
        "partition_dim": int(getattr(param, "partition_dim", -1)),
        "partition_stride": int(getattr(param, "partition_stride", 1)),
    }


def infer_model_rules(model: Any, model_cfg: Any = None, with_attrs: bool = False) -> dict[str, ShardRule]:
    """Rules for every named parameter of a torch module (module types read from the module)."""
    rules = {}
    for name, param in model.named_parameters():
        owner = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        attrs = megatron_attrs(param) if with_attrs else None
        rules[name] = infer_rule(name, tuple(param.shape), type(owner).__name__, model_cfg, attrs)
    return rules
