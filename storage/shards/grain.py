"""What a sharded trainer publishes, as objects grouped into parts, and what each receiver pulls.

A trainer of layout (tp T, pp P, dp D) publishes every parameter as *objects*: the slices a
layout of TP T * split would hold (the "grain"), each cut from the one trainer shard that
contains it. split > 1 lets receivers of TP up to T * split pull only their share, even from a
TP=1 trainer. A parameter whose grain slices do not nest inside the trainer's (vocab rows not
divisible, heads the grain cannot split) is published at the trainer's own slices instead; both
sides derive the same objects from the same ParamSpecs, so nothing about this is negotiated.

Objects are grouped into parts by the grain ranks holding them ("g0", "g1", "all" for
replicated tensors) and by the trainer rank that pushes them: `shards/r{t}.{p}.{d}/{group}`.
A part is the unit a receiver fetches (its own buckets and manifest), so a receiver rank at
the grain pulls its group's parts and the small replicated ones, never the other halves.
Pure bookkeeping over storage.shards.layout/plan: no relay, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from storage.shards.layout import ParallelLayout, Rank, ShardSlice, numel, overlaps, shard_key, slice_for, stages_of
from storage.shards.plan import ParamSpec, PullPiece, ShardSpec, model_facts


@dataclass(frozen=True)
class PublishLayout:
    """The trainer's declared layout and how finely each of its shards is published."""

    trainer: ParallelLayout = ParallelLayout(1)
    split: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.trainer, ParallelLayout):
            raise ValueError(f"PublishLayout.trainer must be a ParallelLayout, got {self.trainer!r}")
        if isinstance(self.split, bool) or not isinstance(self.split, int) or self.split < 1:
            raise ValueError(f"PublishLayout.split must be a positive int, got {self.split!r}")

    @property
    def grain(self) -> int:
        return self.trainer.tp * self.split


@dataclass(frozen=True)
class PublishedObject(ShardSpec):
    """One published slice of one parameter (`name`) and the part group it goes in; its `key`
    is the object's name, version-free so a delta finds its base."""

    group: str = "all"


def object_name(param: ParamSpec, sl: ShardSlice) -> str:
    return shard_key(param.name, param.rule, sl, 0).split("/", 1)[1]


def _contains(outer: ShardSlice, inner: ShardSlice, shape: Sequence[int]) -> bool:
    covered = sum(numel(e - s for s, e in dst) for _, dst in overlaps(outer, inner, shape))
    return covered == inner.numel(shape)


def _group(grain_ranks: Sequence[int], grain: int) -> str:
    ranks = sorted(set(grain_ranks))
    if len(ranks) == grain:
        return "all"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"g{ranks[0]}" + (f"-{ranks[-1]}" if len(ranks) > 1 else "")
    return "g" + "_".join(map(str, ranks))


def param_objects(p: ParamSpec, layout: PublishLayout) -> list[tuple[PublishedObject, list[int]]]:
    """The objects of one parameter, each with the trainer TP ranks whose shard contains it."""
    tp, split = layout.trainer.tp, layout.split
    held = [slice_for(p.rule, p.shape, t, tp) for t in range(tp)]
    try:
        grain = [slice_for(p.rule, p.shape, g, tp * split) for g in range(tp * split)]
        nested = all(_contains(held[g // split], sl, p.shape) for g, sl in enumerate(grain))
    except ValueError:  # the grain cuts a head, or is not a valid TP for this rule
        nested = False
    if not nested:
        grain, split = held, 1  # publish at the trainer's own slices
    by_slice: dict[ShardSlice, list[int]] = {}
    for g, sl in enumerate(grain):
        by_slice.setdefault(sl, []).append(g)
    out = []
    for sl, gs in by_slice.items():
        shape = sl.local_shape(p.shape)
        if numel(shape) == 0:
            continue  # vocab padding only: nothing to publish
        grain_ranks = [r for g in gs for r in range(g * layout.split // split,
                                                     (g + 1) * layout.split // split)]
        holders = sorted({t for t in range(tp) if _contains(held[t], sl, p.shape)})
        obj = PublishedObject(p.name, object_name(p, sl), sl, shape, numel(shape) * p.itemsize,
                              _group(grain_ranks, layout.grain))
        out.append((obj, holders))
    return out


def part_name(rank: Rank, group: str) -> str:
    return f"shards/r{rank[0]}.{rank[1]}.{rank[2]}/{group}"


def rank_parts(params: Sequence[ParamSpec], layout: PublishLayout, *, num_layers: int | None = None,
               tied: bool | None = None) -> dict[Rank, dict[str, list[PublishedObject]]]:
    """Per trainer rank, its parts and their objects: every object pushed exactly once, by the
    least loaded rank holding it (DP and TP replicas share the work, largest first)."""
    lay = layout.trainer
    n_layers, is_tied = model_facts(params, num_layers, tied)
    pieces = []
    for p in params:
        stages = stages_of(p.name, n_layers, lay.pp, is_tied)
        for obj, tps in param_objects(p, layout):
            pieces.append((obj, [(t, s, d) for s in stages for t in tps for d in range(lay.dp)]))
    load = dict.fromkeys(lay.ranks(), 0)
    plan: dict[Rank, dict[str, list[PublishedObject]]] = {r: {} for r in lay.ranks()}
    for obj, holders in sorted(pieces, key=lambda x: (-x[0].nbytes, x[0].key)):
        rank = min(holders, key=lambda r: (load[r], r))
        plan[rank].setdefault(part_name(rank, obj.group), []).append(obj)
        load[rank] += obj.nbytes
    return plan


def receiver_pieces(params: Sequence[ParamSpec], layout: PublishLayout, server: ParallelLayout,
                    rank: Rank, *, server_rules: dict | None = None, num_layers: int | None = None,
                    tied: bool | None = None) -> list[PullPiece]:
    """The pieces of published objects (PullPiece.key = the object's key) that fill server rank
    `rank`'s own slices exactly; server_rules overrides a parameter's rule on that side."""
    n_layers, is_tied = model_facts(params, num_layers, tied)
    t, s, _ = rank
    pieces = []
    for p in params:
        if s not in stages_of(p.name, n_layers, server.pp, is_tied):
            continue
        mine = slice_for((server_rules or {}).get(p.name, p.rule), p.shape, t, server.tp)
        for obj, _ in param_objects(p, layout):
            for sbox, dbox in overlaps(obj.slice, mine, p.shape):
                pieces.append(PullPiece(obj.key, p.name, sbox, dbox, obj.shape,
                                        mine.local_shape(p.shape), p.itemsize))
    return pieces


def cut(local: torch.Tensor, held: ShardSlice, want: ShardSlice, full_shape: Sequence[int]) -> torch.Tensor:
    """The object `want` cut from a shard holding `held` (want must lie inside held)."""
    parts = overlaps(held, want, full_shape)
    if len(parts) == 1 and want.local_shape(full_shape) == tuple(local.shape):
        return local.contiguous()
    out = torch.empty(want.local_shape(full_shape), dtype=local.dtype)
    for src, dst in parts:
        out[tuple(slice(a, b) for a, b in dst)] = local[tuple(slice(a, b) for a, b in src)]
    return out
