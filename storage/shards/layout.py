"""Shard layout: which slice of each full tensor a (tp, pp, dp) rank holds, and its object key.

A slice is an ordered list of ranges along the rule's dim; the local tensor is the concatenation
of those ranges of the full tensor, in that order (gated fc1: [gate_r, up_r]; grouped QKV: per
query group [q heads, k, v]). `overlaps` maps the common part of two slices between their local
tensors, which is all a transfer between different TP/PP layouts needs (see storage.shards.plan).
"""

from __future__ import annotations

import functools

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from storage.shards.rules import ShardRule

Range = tuple[int, int]
Box = tuple[Range, ...]  # one (start, stop) per dim
Rank = tuple[int, int, int]  # (tp_rank, pp_rank, dp_rank)


@dataclass(frozen=True)
class ParallelLayout:
    tp: int
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ParallelLayout.{name} must be a positive int, got {value!r}")

    def ranks(self) -> list[Rank]:
        return [(t, p, d) for p in range(self.pp) for t in range(self.tp) for d in range(self.dp)]


@dataclass(frozen=True)
class ShardSlice:
    """Ranges of the full tensor along `dim` (None: the whole tensor), in local order."""

    dim: int | None
    ranges: tuple[Range, ...] = ()

    def boxes(self, full_shape: Sequence[int]) -> list[Box]:
        whole = tuple((0, n) for n in full_shape)
        if self.dim is None:
            return [whole]
        return [whole[: self.dim] + (r,) + whole[self.dim + 1 :] for r in self.ranges]

    def local_shape(self, full_shape: Sequence[int]) -> tuple[int, ...]:
        if self.dim is None:
            return tuple(full_shape)
        shape = list(full_shape)
        shape[self.dim] = sum(e - s for s, e in self.ranges)
        return tuple(shape)

    def numel(self, full_shape: Sequence[int]) -> int:
        return numel(self.local_shape(full_shape))


def numel(shape: Iterable[int]) -> int:
    """Elements of a tensor of this shape (1 for a scalar)."""
    n = 1
    for s in shape:
        n *= s
    return n


def _coalesce(ranges: Iterable[Range]) -> tuple[Range, ...]:
    """Join neighbours that are contiguous in the full tensor (keeps local order)."""
    out: list[Range] = []
    for s, e in ranges:
        if e <= s:
            continue
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return tuple(out)


def _qkv_grouped_ranges(rule: ShardRule, n: int, tp_rank: int, tp: int) -> tuple[Range, ...]:
    """megatron linear_qkv: rank r holds rows [r n/tp, (r+1) n/tp) of the grouped order
    (q heads, k, v per query group); map them back to [Q; K; V] rows of the full tensor."""
    h, g, d = rule.num_heads, rule.num_groups, rule.head_dim
    if n != (h + 2 * g) * d:
        raise ValueError(f"fused QKV has {n} rows, config implies ({h} + 2*{g}) * {d} = {(h + 2 * g) * d}")
    if (g % tp if g >= tp else tp % g) or h % tp or n % tp:
        raise ValueError(f"megatron QKV: tp {tp} must divide query groups {g} (or be a multiple of it) and heads {h}")
    hpg = h // g
    a, b = tp_rank * n // tp, (tp_rank + 1) * n // tp
    out = []
    for grp in range(g):
        base = grp * (hpg + 2) * d  # grouped offset of this group's [q..., k, v]
        segments = ((base, grp * hpg * d, hpg * d), (base + hpg * d, h * d + grp * d, d),
                    (base + (hpg + 1) * d, (h + g) * d + grp * d, d))
        for start, full_start, length in segments:
            lo, hi = max(a, start), min(b, start + length)
            if lo < hi:
                out.append((full_start + lo - start, full_start + hi - start))
    return _coalesce(out)


def slice_for(rule: ShardRule, full_shape: Sequence[int], tp_rank: int, tp: int) -> ShardSlice:
    """The ranges of the full tensor that TP rank `tp_rank` of `tp` holds under `rule`."""
    if not 0 <= tp_rank < tp:
        raise ValueError(f"tp_rank {tp_rank} out of range for tp {tp}")
    if rule.dim is None or tp == 1 and rule.layout == "plain":
        return ShardSlice(None) if rule.dim is None else ShardSlice(rule.dim, ((0, full_shape[rule.dim]),))
    n = full_shape[rule.dim]
    if rule.layout == "qkv_grouped":
        return ShardSlice(0, _qkv_grouped_ranges(rule, n, tp_rank, tp))
    if rule.layout == "gated":
        if n % (rule.stride * tp):
            raise ValueError(f"gated dim of {n} rows not divisible by stride {rule.stride} * tp {tp}")
        c = n // (rule.stride * tp)
        starts = [k * n // rule.stride + tp_rank * c for k in range(rule.stride)]
        return ShardSlice(0, tuple((a, a + c) for a in starts))
    if rule.kind == "vocab":
        per = -(-n // tp)
        per = -(-per // rule.vocab_pad) * rule.vocab_pad  # padding rows hold no data: clip to n
        return ShardSlice(0, ((min(tp_rank * per, n), min((tp_rank + 1) * per, n)),))
    units = rule.units or n
    if n % units:
        raise ValueError(f"dim {rule.dim} of size {n} is not a whole number of {units} units (heads)")
    size = n // units
    if units % tp == 0:
        per = units // tp * size
        return ShardSlice(rule.dim, ((tp_rank * per, (tp_rank + 1) * per),))
    if rule.replicate_units and tp % units == 0:
        unit = tp_rank // (tp // units)  # vLLM: consecutive ranks share one KV head
        return ShardSlice(rule.dim, ((unit * size, (unit + 1) * size),))
    raise ValueError(f"tp {tp} does not divide the {units} units (heads/rows) of dim {rule.dim}")


def overlaps(src: ShardSlice, dst: ShardSlice, full_shape: Sequence[int]) -> list[tuple[Box, Box]]:
    """(box in src's local tensor, box in dst's local tensor) for every region both hold."""
    def placed(sl: ShardSlice) -> list[tuple[Box, int]]:
        out, offset = [], 0
        for box in sl.boxes(full_shape):
            out.append((box, offset))
            offset += box[sl.dim][1] - box[sl.dim][0] if sl.dim is not None else 0
        return out

    def local(box: Box, block: Box, offset: int, dim: int | None) -> Box:
        return tuple((s - b[0] + (offset if i == dim else 0), e - b[0] + (offset if i == dim else 0))
                     for i, ((s, e), b) in enumerate(zip(box, block)))

    result = []
    for dbox, doff in placed(dst):
        for sbox, soff in placed(src):
            inter = tuple((max(a[0], b[0]), min(a[1], b[1])) for a, b in zip(dbox, sbox))
            if all(s < e for s, e in inter):
                result.append((local(inter, sbox, soff, src.dim), local(inter, dbox, doff, dst.dim)))
    return result


# -- pipeline stages --------------------------------------------------------------------------

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_FIRST = ("embed_tokens", "word_embeddings", "position_embeddings")
_LAST = ("lm_head", "output_layer", "final_layernorm", "final_norm")


def layer_stages(num_layers: int, pp: int) -> list[int]:
    """Stage of each decoder layer: even split, the remainder to the stages before the last
    (vLLM's rule; equals megatron's even split whenever pp divides num_layers)."""
    if pp < 1 or num_layers < pp:
        raise ValueError(f"cannot split {num_layers} layers over {pp} pipeline stages")
    counts = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        counts[-2 - i] += 1
    return [stage for stage, c in enumerate(counts) for _ in range(c)]


@functools.lru_cache(maxsize=65536)  # asked of every tensor of every publish
def layer_index(param_name: str) -> int | None:
    """Decoder layer number in an HF (`model.layers.3.`) or megatron (`decoder.layers.3.`) name."""
    m = _LAYER.search(param_name)
    return int(m[1]) if m else None


def stage_of(param_name: str, num_layers: int, pp: int) -> int:
    """Pipeline stage owning a parameter: embeddings first, final norm + lm_head last."""
    layer = layer_index(param_name)
    if layer is not None:
        if layer >= num_layers:
            raise ValueError(f"{param_name}: layer {layer} >= num_layers {num_layers}")
        return layer_stages(num_layers, pp)[layer]
    if any(k in param_name for k in _FIRST):
        return 0
    if any(k in param_name for k in _LAST) or re.search(r"(?:^|\.)norm\.weight$", param_name):
        return pp - 1
    raise ValueError(f"cannot place {param_name!r} on a pipeline stage (no layer index, not embedding/head)")


def stages_of(param_name: str, num_layers: int, pp: int, tied: bool = False) -> tuple[int, ...]:
    """Stages holding a parameter; a tied input embedding also serves as lm_head on the last."""
    stage = stage_of(param_name, num_layers, pp)
    if tied and stage == 0 and any(k in param_name for k in _FIRST[:2]) and pp > 1:
        return (0, pp - 1)
    return (stage,)


# -- keys and plans ---------------------------------------------------------------------------

def shard_key(name: str, rule: ShardRule, ranges: ShardSlice, version: int) -> str:
    """Object key `v{version}/{name}/{slice}`; slice is `full` or `d{dim}:{a}-{b}+{c}-{d}`."""
    if ranges.dim != rule.dim and ranges.dim is not None:
        raise ValueError(f"{name}: slice along dim {ranges.dim} does not match rule dim {rule.dim}")
    tag = "full" if ranges.dim is None else f"d{ranges.dim}:" + "+".join(f"{s}-{e}" for s, e in ranges.ranges)
    return f"v{int(version)}/{name}/{tag}"


def parse_shard_key(key: str) -> tuple[str, ShardSlice, int]:
    """Inverse of shard_key: (name, slice, version)."""
    m = re.fullmatch(r"v(\d+)/(.+)/(full|d(\d+):((?:\d+-\d+)(?:\+\d+-\d+)*))", key)
    if m is None:
        raise ValueError(f"not a shard key: {key!r}")
    if m[3] == "full":
        return m[2], ShardSlice(None), int(m[1])
    ranges = tuple(tuple(map(int, r.split("-"))) for r in m[5].split("+"))
    return m[2], ShardSlice(int(m[4]), ranges), int(m[1])  # type: ignore[arg-type]

