"""Shard layouts and transfer plans: slices, stages, keys, publish/pull plans, bit-exact round trips."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from storage.shards.layout import (
    ParallelLayout,
    ShardSlice,
    parse_shard_key,
    shard_key,
    slice_for,
    stage_of,
    stages_of,
)
from storage.shards.plan import (
    ParamSpec,
    apply_pull,
    assemble,
    param_specs,
    publish_plan,
    pull_plan,
    reshard,
    split_full,
)
from storage.shards.rules import REPLICATED, ShardRule, infer_model_rules, infer_rule

QKV = ShardRule("column", 0, "qkv_grouped", num_heads=4, num_groups=2, head_dim=2)  # Q 0-8, K 8-12, V 12-16
GATED = ShardRule("column", 0, "gated", stride=2)


def test_slices_hand_computed() -> None:
    # group g = [q heads 2g, 2g+1 | k_g | v_g]; tp=2 gives each rank one whole group
    assert [slice_for(QKV, (16, 3), t, 2).ranges for t in range(2)] == [
        ((0, 4), (8, 10), (12, 14)), ((4, 8), (10, 12), (14, 16))]
    # tp=4 > 2 groups: megatron splits each group's 8 grouped rows in two
    assert [slice_for(QKV, (16, 3), t, 4).ranges for t in range(4)] == [
        ((0, 4),), ((8, 10), (12, 14)), ((4, 8),), ((10, 12), (14, 16))]
    # tp=1 still holds the grouped order
    assert slice_for(QKV, (16, 3), 0, 1).ranges == ((0, 4), (8, 10), (12, 14), (4, 8), (10, 12), (14, 16))
    assert [slice_for(GATED, (8, 3), t, 2).ranges for t in range(2)] == [((0, 2), (4, 6)), ((2, 4), (6, 8))]
    row = ShardRule("row", 1)
    assert slice_for(row, (3, 8), 1, 4) == ShardSlice(1, ((2, 4),))
    vocab = ShardRule("vocab", 0)  # 10 rows over 4 ranks: 3 per rank, the last holds 1 real row
    assert [slice_for(vocab, (10, 2), t, 4).ranges for t in range(4)] == [((0, 3),), ((3, 6),), ((6, 9),), ((9, 10),)]
    padded = ShardRule("vocab", 0, vocab_pad=4)  # 4 rows per rank: rank 2 holds 8-10, rank 3 nothing real
    assert [slice_for(padded, (10, 2), t, 4).ranges for t in (2, 3)] == [((8, 10),), ((10, 10),)]
    assert slice_for(REPLICATED, (5,), 3, 4) == ShardSlice(None)


@pytest.mark.parametrize("groups, tp", [(2, 3), (3, 2), (4, 8)])
def test_megatron_qkv_rejects_tp_that_does_not_divide(groups: int, tp: int) -> None:
    rule = ShardRule("column", 0, "qkv_grouped", num_heads=4 if groups != 3 else 6, num_groups=groups, head_dim=2)
    rows = (rule.num_heads + 2 * groups) * 2
    with pytest.raises(ValueError, match=f"tp {tp} must divide"):
        slice_for(rule, (rows, 2), 0, tp)


def test_heads_are_never_cut() -> None:
    q = ShardRule("column", 0, units=4)  # 4 heads of 2 rows
    with pytest.raises(ValueError, match="tp 3 does not divide"):
        slice_for(q, (8, 2), 0, 3)
    with pytest.raises(ValueError, match="not a whole number"):
        slice_for(q, (9, 2), 0, 1 + 1)
    with pytest.raises(ValueError, match="gated dim of 6 rows"):
        slice_for(GATED, (6, 2), 0, 2)


def test_parallel_layout_validation() -> None:
    assert len(ParallelLayout(2, 2, 2).ranks()) == 8
    for bad in ({"tp": 0}, {"tp": 2, "pp": -1}, {"tp": 1, "dp": 1.5}):
        with pytest.raises(ValueError, match="must be a positive int"):
            ParallelLayout(**bad)


def test_pipeline_stages() -> None:
    # 5 layers on 2 stages: vLLM gives the extra layer to the first stage -> [0,0,0,1,1]
    assert [stage_of(f"model.layers.{i}.mlp.up_proj.weight", 5, 2) for i in range(5)] == [0, 0, 0, 1, 1]
    assert stage_of("decoder.layers.2.mlp.linear_fc1.weight", 4, 2) == 1
    assert stage_of("model.embed_tokens.weight", 4, 2) == 0
    assert stage_of("embedding.word_embeddings.weight", 4, 4) == 0
    assert stage_of("model.norm.weight", 4, 2) == 1 and stage_of("lm_head.weight", 4, 2) == 1
    assert stage_of("decoder.final_layernorm.weight", 4, 4) == 3 and stage_of("output_layer.weight", 4, 4) == 3
    assert stages_of("model.embed_tokens.weight", 4, 2, tied=True) == (0, 1)
    assert stages_of("model.embed_tokens.weight", 4, 1, tied=True) == (0,)
    with pytest.raises(ValueError, match="cannot place 'rotary.inv_freq'"):
        stage_of("rotary.inv_freq", 4, 2)
    with pytest.raises(ValueError, match="cannot split 2 layers over 3"):
        stage_of("model.layers.0.mlp.up_proj.weight", 2, 3)


def test_shard_keys_encode_slices() -> None:
    sl = slice_for(QKV, (16, 3), 1, 2)
    key = shard_key("decoder.layers.0.self_attention.linear_qkv.weight", QKV, sl, 7)
    assert key == "v7/decoder.layers.0.self_attention.linear_qkv.weight/d0:4-8+10-12+14-16"
    assert parse_shard_key(key) == ("decoder.layers.0.self_attention.linear_qkv.weight", sl, 7)
    assert parse_shard_key(shard_key("model.norm.weight", REPLICATED, ShardSlice(None), 3)) == (
        "model.norm.weight", ShardSlice(None), 3)
    with pytest.raises(ValueError, match="not a shard key"):
        parse_shard_key("model.norm.weight")


# -- models and bit-exact round trips ---------------------------------------------------------

def _qwen_params(kind: str, kv: int, tied: bool) -> tuple[dict[str, torch.Tensor], list[ParamSpec]]:
    """Tiny HF Qwen, bf16, with NaN / -0 / Inf bit patterns planted in every tensor."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    common = dict(vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=kv, tie_word_embeddings=tied)
    cfg = Qwen3Config(head_dim=4, **common) if kind == "qwen3" else Qwen2Config(**common)
    model = (Qwen3ForCausalLM if kind == "qwen3" else Qwen2ForCausalLM)(cfg)
    rules = infer_model_rules(model, cfg)
    specials = torch.tensor([0x7FC1, -0x8000, 0x7F80], dtype=torch.int16)  # NaN payload, -0, +Inf
    state = {}
    for name, p in model.named_parameters():
        bits = p.detach().to(torch.bfloat16).contiguous().view(torch.int16).reshape(-1).clone()
        where = torch.linspace(0, bits.numel() - 1, 3).long()
        bits[where] = specials
        state[name] = bits.view(torch.bfloat16).reshape(p.shape)
    return state, param_specs(state.items(), rules)


def _megatron_params() -> tuple[dict[str, torch.Tensor], list[ParamSpec]]:
    """Megatron-named layers (grouped QKV with 4 query groups, gated fc1), random bf16 bits."""
    cfg = dict(num_attention_heads=8, num_query_groups=4, kv_channels=2, hidden_size=16, gated_linear_unit=True)
    shapes = {"embedding.word_embeddings.weight": (64, 16), "output_layer.weight": (64, 16),
              "decoder.final_layernorm.weight": (16,)}
    for i in range(2):
        pre = f"decoder.layers.{i}."
        shapes |= {pre + "self_attention.linear_qkv.weight": ((8 + 2 * 4) * 2, 16),
                   pre + "self_attention.linear_qkv.bias": ((8 + 2 * 4) * 2,),
                   pre + "self_attention.linear_qkv.layer_norm_weight": (16,),
                   pre + "self_attention.linear_proj.weight": (16, 16),
                   pre + "mlp.linear_fc1.weight": (64, 16), pre + "mlp.linear_fc2.weight": (16, 32)}
    gen = torch.Generator().manual_seed(2)
    state = {n: torch.randint(-(2**15), 2**15, s, dtype=torch.int16, generator=gen).view(torch.bfloat16)
             for n, s in shapes.items()}
    rules = {n: infer_rule(n, s, None, cfg) for n, s in shapes.items()}
    return state, param_specs(state.items(), rules)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


def _transfer(state, specs, trainer: ParallelLayout, server: ParallelLayout) -> dict:
    """Publish from every trainer rank per the plan, pull per the server plan, check every byte."""
    store: dict[str, torch.Tensor] = {}
    for (t, _, _), shards in publish_plan(specs, trainer, version=5).items():
        for spec in shards:
            rule = next(p.rule for p in specs if p.name == spec.name)
            local = split_full(state[spec.name], rule, trainer.tp)[t]  # what trainer rank t holds
            assert spec.key not in store, f"{spec.key} published twice"
            assert tuple(local.shape) == spec.shape and spec.nbytes == local.numel() * 2
            store[spec.key] = local
    pulled = Counter()

    def fetch(key: str) -> torch.Tensor:
        pulled[key] += 1
        return store[key]

    plan = pull_plan(specs, server, trainer, version=5)
    received = {rank: apply_pull(pieces, fetch) for rank, pieces in plan.items()}
    by_name = {p.name: p for p in specs}
    for (t, s, d), local in received.items():
        need = 0
        for name, tensor in local.items():
            expect = split_full(state[name], by_name[name].rule, server.tp)[t]
            assert _same_bits(tensor, expect), f"server rank {(t, s, d)} got wrong bits for {name}"
            need += expect.numel() * 2
            # every element of the destination written exactly once
            cover = torch.zeros(expect.shape, dtype=torch.int32)
            for piece in plan[(t, s, d)]:
                if piece.name == name:
                    cover[tuple(slice(a, b) for a, b in piece.dst)] += 1
            assert bool((cover == 1).all()), f"{name}: destination not covered exactly once"
        assert sum(p.nbytes for p in plan[(t, s, d)]) == need  # no byte it does not need
        for piece in plan[(t, s, d)]:  # ranged reads of the published bytes give the same slice
            raw = store[piece.key].contiguous().view(torch.uint8).reshape(-1)
            got = torch.cat([raw[o:o + n] for o, n in piece.src_byte_runs()])
            want = store[piece.key][tuple(slice(a, b) for a, b in piece.src)].contiguous()
            assert torch.equal(got, want.view(torch.uint8).reshape(-1))
    return received


LAYOUTS = [ParallelLayout(1), ParallelLayout(2), ParallelLayout(4), ParallelLayout(1, 2),
           ParallelLayout(2, 2), ParallelLayout(4, 2, 2)]


@pytest.mark.parametrize("kind, kv, tied", [("qwen3", 4, True), ("qwen3", 2, False), ("qwen2", 2, True),
                                            ("qwen2", 4, False)])
def test_hf_qwen_round_trips_between_layouts(kind: str, kv: int, tied: bool) -> None:
    state, specs = _qwen_params(kind, kv, tied)
    for a, b in [(LAYOUTS[0], LAYOUTS[1]), (LAYOUTS[1], LAYOUTS[2]), (LAYOUTS[2], LAYOUTS[0]),
                 (LAYOUTS[1], LAYOUTS[3]), (LAYOUTS[3], LAYOUTS[4]), (LAYOUTS[4], LAYOUTS[5]),
                 (LAYOUTS[5], LAYOUTS[0])]:
        received = _transfer(state, specs, a, b)
        # reassemble the full model from the receiver's ranks: identical bits
        for p in specs:
            for stage in stages_of(p.name, 4, b.pp, tied):
                shards = [received[(t, stage, 0)][p.name] for t in range(b.tp)]
                assert _same_bits(assemble(shards, p.rule, p.shape), state[p.name]), (a, b, p.name)


@pytest.mark.parametrize("trainer, server", [(LAYOUTS[0], LAYOUTS[2]), (LAYOUTS[2], LAYOUTS[1]),
                                             (LAYOUTS[4], LAYOUTS[3]), (LAYOUTS[1], LAYOUTS[5])])
def test_megatron_layout_round_trips(trainer: ParallelLayout, server: ParallelLayout) -> None:
    state, specs = _megatron_params()
    received = _transfer(state, specs, trainer, server)
    for p in specs:
        stage = stages_of(p.name, 2, server.pp)[0]
        shards = [received[(t, stage, 0)][p.name] for t in range(server.tp)]
        assert _same_bits(assemble(shards, p.rule, p.shape), state[p.name]), p.name


def test_pull_plan_pieces_hand_computed() -> None:
    # q_proj (8 rows) published by TP2 -> a TP1 receiver pulls both halves whole
    spec = ParamSpec("model.layers.0.self_attn.q_proj.weight", (8, 3), ShardRule("column", 0, units=4))
    (pieces,) = pull_plan([spec], ParallelLayout(1), ParallelLayout(2), version=1).values()
    assert [(p.key.rsplit("/", 1)[1], p.src, p.dst) for p in pieces] == [
        ("d0:0-4", ((0, 4), (0, 3)), ((0, 4), (0, 3))), ("d0:4-8", ((0, 4), (0, 3)), ((4, 8), (0, 3)))]
    # row-parallel (dim 1) TP2 -> TP4 rank 3 pulls columns 2-4 of the second published shard
    row = ParamSpec("model.layers.0.mlp.down_proj.weight", (3, 8), ShardRule("row", 1))
    plan = pull_plan([row], ParallelLayout(4), ParallelLayout(2))
    (piece,) = plan[(3, 0, 0)]
    assert (piece.src, piece.dst, piece.src_shape, piece.dst_shape, piece.nbytes) == (
        ((0, 3), (2, 4)), ((0, 3), (0, 2)), (3, 4), (3, 2), 12)
    # a ranged read of the row-major (3, 4) bf16 shard: columns 2-3 of each row = bytes 4-8, 12-16, 20-24
    assert piece.src_byte_runs() == [(4, 4), (12, 4), (20, 4)]
    # dim-0 pieces are one contiguous run
    (half,) = pull_plan([spec], ParallelLayout(4), ParallelLayout(2))[(1, 0, 0)]
    assert (half.src, half.src_byte_runs()) == (((2, 4), (0, 3)), [(12, 12)])


def test_publish_plan_splits_shards_across_dp_once_and_balanced() -> None:
    state, specs = _qwen_params("qwen3", 4, False)
    layout = ParallelLayout(2, 2, 2)
    plan = publish_plan(specs, layout)
    keys = [s.key for shards in plan.values() for s in shards]
    assert len(keys) == len(set(keys))  # nothing sent twice
    # every distinct slice of every parameter is published: bytes add up to the model once
    assert sum(s.nbytes for shards in plan.values() for s in shards) == sum(t.numel() * 2 for t in state.values())
    for (t, p, _), shards in plan.items():
        for s in shards:  # a rank only publishes what it holds
            assert stage_of(s.name, 4, 2) == p
            rule = next(x.rule for x in specs if x.name == s.name)
            assert slice_for(rule, state[s.name].shape, t, 2) == s.slice
    # DP replicas of one (tp, pp) share the work: loads differ by at most the largest piece
    for t in range(2):
        for p in range(2):
            loads = [sum(s.nbytes for s in plan[(t, p, d)]) for d in range(2)]
            assert max(loads) - min(loads) <= max(s.nbytes for d in range(2) for s in plan[(t, p, d)])
    # replicated norms go out once, not once per TP rank
    norm = [s for shards in plan.values() for s in shards if s.name == "model.norm.weight"]
    assert len(norm) == 1


def test_reshard_and_assemble_direct() -> None:
    full = torch.randint(-(2**15), 2**15, (16, 6), dtype=torch.int16).view(torch.bfloat16)
    for rule in (QKV, GATED, ShardRule("column", 0, units=8, replicate_units=True), REPLICATED):
        for a, b in ((1, 2), (2, 4), (4, 1), (2, 2)):
            got = reshard(split_full(full, rule, a), rule, full.shape, b)
            assert all(_same_bits(x, y) for x, y in zip(got, split_full(full, rule, b)))
            assert _same_bits(assemble(got, rule, full.shape), full)
    # QKV in megatron's grouped order -> plain [Q; K; V] rows at TP2 (another rule on the receiver)
    got = reshard(split_full(full, QKV, 2), QKV, full.shape, 2, ShardRule("column", 0))
    assert _same_bits(got[0], full[:8]) and _same_bits(got[1], full[8:])


def test_assemble_rejects_disagreeing_replicas() -> None:
    full = torch.arange(8, dtype=torch.float32)
    shards = split_full(full, REPLICATED, 2)
    shards[1][3] = -1.0
    with pytest.raises(ValueError, match="replicas of the same slice differ"):
        assemble(shards, REPLICATED, full.shape)
    with pytest.raises(ValueError, match="shard 0 has shape"):
        assemble([full[:3], full[4:]], ShardRule("column", 0), full.shape)
