"""Transfer plans over shard layouts, and tensor helpers to split, assemble and reshard.

publish_plan: which trainer rank pushes which distinct slice (each exactly once, DP and TP
replicas share the work, balanced by bytes). pull_plan: for each rank of a receiver with another
TP/PP layout, the sub-boxes of published shards that fill its own slices: no byte it does not need.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from storage.shards.layout import (
    Box,
    ParallelLayout,
    Rank,
    ShardSlice,
    layer_index,
    numel,
    overlaps,
    shard_key,
    slice_for,
    stages_of,
)
from storage.shards.rules import ShardRule


@dataclass(frozen=True)
class ParamSpec:
    """One full parameter as the plans see it (names, shapes and rules agree on both sides)."""

    name: str
    shape: tuple[int, ...]
    rule: ShardRule
    itemsize: int = 2  # bf16

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(n) for n in self.shape))


def param_specs(tensors: Iterable[tuple[str, torch.Tensor]], rules: dict[str, ShardRule]) -> list[ParamSpec]:
    """ParamSpecs for (name, full tensor) pairs, e.g. model.named_parameters()."""
    pairs = list(tensors)
    missing = [n for n, _ in pairs if n not in rules]
    if missing:
        raise ValueError(f"no shard rule for {missing[0]!r} ({len(missing)} parameters lack one)")
    return [ParamSpec(n, tuple(t.shape), rules[n], t.element_size()) for n, t in pairs]


@dataclass(frozen=True)
class ShardSpec:
    """One published object: a distinct slice of one parameter."""

    name: str
    key: str
    slice: ShardSlice
    shape: tuple[int, ...]  # local shape
    nbytes: int


@dataclass(frozen=True)
class PullPiece:
    """Copy `src` of the published shard `key` into `dst` of the receiver's local `name`."""

    key: str
    name: str
    src: Box
    dst: Box
    src_shape: tuple[int, ...]
    dst_shape: tuple[int, ...]
    itemsize: int = 2

    @property
    def nbytes(self) -> int:
        return numel(e - s for s, e in self.src) * self.itemsize

    def src_byte_runs(self) -> list[tuple[int, int]]:
        """(offset, length) byte runs of `src` in the row-major published shard: a ranged read
        fetches exactly these (one run for a dim-0 box, one per row for a dim-1 box)."""
        k = len(self.src_shape) - 1  # first dim from which the box spans everything after it
        while k > 0 and self.src[k] == (0, self.src_shape[k]):
            k -= 1
        inner = numel(self.src_shape[k + 1:]) * self.itemsize
        run = (self.src[k][1] - self.src[k][0]) * inner if self.src else self.itemsize
        runs: list[tuple[int, int]] = []
        for outer in itertools.product(*(range(s, e) for s, e in self.src[:k])):
            flat = 0
            for i, n in zip(outer, self.src_shape):
                flat = flat * n + i
            offset = (flat * self.src_shape[k] + self.src[k][0]) * inner if self.src else 0
            if runs and runs[-1][0] + runs[-1][1] == offset:
                runs[-1] = (runs[-1][0], runs[-1][1] + run)
            else:
                runs.append((offset, run))
        return runs


def model_facts(params: Sequence[ParamSpec], num_layers: int | None, tied: bool | None) -> tuple[int, bool]:
    """(layers, tied embeddings), from the names unless given: no lm_head/output_layer = tied."""
    layers = [i for p in params if (i := layer_index(p.name)) is not None]
    n = num_layers if num_layers is not None else (max(layers) + 1 if layers else 1)
    has_head = any(k in p.name for p in params for k in ("lm_head", "output_layer"))
    return n, (not has_head) if tied is None else tied


def _distinct_slices(p: ParamSpec, tp: int) -> dict[ShardSlice, list[int]]:
    """Distinct slices of a parameter over TP ranks -> the TP ranks holding each."""
    out: dict[ShardSlice, list[int]] = {}
    for t in range(tp):
        out.setdefault(slice_for(p.rule, p.shape, t, tp), []).append(t)
    return out


def publish_plan(params: Sequence[ParamSpec], trainer_layout: ParallelLayout, *, version: int = 0,
                 num_layers: int | None = None, tied: bool | None = None) -> dict[Rank, list[ShardSpec]]:
    """Which shards each trainer rank pushes: every distinct slice once, spread over the ranks
    holding it (DP replicas, TP replicas of replicated tensors) by largest-first to least loaded.
    num_layers/tied default to what the names say (no lm_head/output_layer: tied embeddings)."""
    lay = trainer_layout
    n_layers, is_tied = model_facts(params, num_layers, tied)
    pieces = []
    for p in params:
        stages = stages_of(p.name, n_layers, lay.pp, is_tied)
        for sl, tps in _distinct_slices(p, lay.tp).items():
            shape = sl.local_shape(p.shape)
            if numel(shape) == 0:
                continue  # a rank holding only vocab padding has nothing to publish
            spec = ShardSpec(p.name, shard_key(p.name, p.rule, sl, version), sl, shape, numel(shape) * p.itemsize)
            holders = [(t, s, d) for s in stages for t in tps for d in range(lay.dp)]
            pieces.append((spec, holders))
    plan: dict[Rank, list[ShardSpec]] = {r: [] for r in lay.ranks()}
    load = dict.fromkeys(plan, 0)
    for spec, holders in sorted(pieces, key=lambda x: (-x[0].nbytes, x[0].key)):
        rank = min(holders, key=lambda r: (load[r], r))
        plan[rank].append(spec)
        load[rank] += spec.nbytes
    return plan


def pull_plan(params: Sequence[ParamSpec], server_layout: ParallelLayout, trainer_layout: ParallelLayout, *,
              version: int = 0, server_rules: dict[str, ShardRule] | None = None, num_layers: int | None = None,
              tied: bool | None = None) -> dict[Rank, list[PullPiece]]:
    """Per server rank: the (published key, source box, destination box) pieces that fill its
    local shards exactly. server_rules overrides a parameter's rule on the serving side."""
    n_layers, is_tied = model_facts(params, num_layers, tied)
    plan: dict[Rank, list[PullPiece]] = {}
    for t, s, d in server_layout.ranks():
        pieces = plan.setdefault((t, s, d), [])
        for p in params:
            if s not in stages_of(p.name, n_layers, server_layout.pp, is_tied):
                continue
            rule = (server_rules or {}).get(p.name, p.rule)
            mine = slice_for(rule, p.shape, t, server_layout.tp)
            shape = mine.local_shape(p.shape)
            for src in _distinct_slices(p, trainer_layout.tp):
                key = shard_key(p.name, p.rule, src, version)
                src_shape = src.local_shape(p.shape)
                for sbox, dbox in overlaps(src, mine, p.shape):
                    pieces.append(PullPiece(key, p.name, sbox, dbox, src_shape, shape, p.itemsize))
    return plan


# -- tensor helpers ---------------------------------------------------------------------------

def _ix(box: Box) -> tuple[slice, ...]:
    return tuple(slice(s, e) for s, e in box)


def split_full(tensor: torch.Tensor, rule: ShardRule, layout: ParallelLayout | int) -> list[torch.Tensor]:
    """Local shard of every TP rank (index = tp rank), cut from the full tensor."""
    tp = layout if isinstance(layout, int) else layout.tp
    out = []
    for t in range(tp):
        sl = slice_for(rule, tensor.shape, t, tp)
        parts = [tensor[_ix(b)] for b in sl.boxes(tensor.shape)]
        out.append(torch.cat(parts, dim=sl.dim).contiguous() if sl.dim is not None else tensor.clone())
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def assemble(shards: Sequence[torch.Tensor], rule: ShardRule, full_shape: Sequence[int]) -> torch.Tensor:
    """Full tensor from all TP ranks' shards; replicas must agree bit for bit."""
    tp = len(shards)
    full = torch.empty(tuple(full_shape), dtype=shards[0].dtype)
    seen: dict[ShardSlice, torch.Tensor] = {}
    for t, shard in enumerate(shards):
        sl = slice_for(rule, full_shape, t, tp)
        if tuple(shard.shape) != sl.local_shape(full_shape):
            raise ValueError(f"shard {t} has shape {tuple(shard.shape)}, expected {sl.local_shape(full_shape)}")
        if sl in seen:
            if not torch.equal(_bits(seen[sl]), _bits(shard)):
                raise ValueError(f"replicas of the same slice differ (tp rank {t})")
            continue
        seen[sl] = shard
        for src, dst in overlaps(sl, ShardSlice(None), full_shape):
            full[_ix(dst)] = shard[_ix(src)]
    return full


def reshard(shards: Sequence[torch.Tensor], rule: ShardRule, full_shape: Sequence[int], new_tp: int,
            new_rule: ShardRule | None = None) -> list[torch.Tensor]:
    """Shards for `new_tp` (and optionally another rule) straight from the old shards."""
    old = {slice_for(rule, full_shape, t, len(shards)): shard for t, shard in enumerate(shards)}
    out = []
    for t in range(new_tp):
        mine = slice_for(new_rule or rule, full_shape, t, new_tp)
        local = torch.empty(mine.local_shape(full_shape), dtype=shards[0].dtype)
        for src_slice, shard in old.items():
            for src, dst in overlaps(src_slice, mine, full_shape):
                local[_ix(dst)] = shard[_ix(src)]
        out.append(local)
    return out


def apply_pull(pieces: Iterable[PullPiece], fetch: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Build a receiver rank's local shards from its pull plan; fetch(key) -> published shard."""
    local: dict[str, torch.Tensor] = {}
    for piece in pieces:
        src = fetch(piece.key)
        if piece.name not in local:
            local[piece.name] = torch.empty(piece.dst_shape, dtype=src.dtype)
        local[piece.name][_ix(piece.dst)] = src[_ix(piece.src)]
    return local
