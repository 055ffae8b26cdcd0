"""Shard-rule inference: HF Qwen2/Qwen3 models and megatron-core TP layers on gloo."""

from __future__ import annotations


import pytest
import torch

from storage.shards.layout import slice_for
from storage.shards.plan import split_full
from storage.shards.rules import REPLICATED, ShardRule, infer_model_rules, infer_rule, megatron_attrs

HEADS, KV, HEAD_DIM, HIDDEN, FFN = 8, 2, 4, 32, 48


def _qwen(kind: str, tied: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    common = dict(vocab_size=96, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=2,
                  num_attention_heads=HEADS, num_key_value_heads=KV, tie_word_embeddings=tied)
    if kind == "qwen3":
        cfg = Qwen3Config(head_dim=HEAD_DIM, **common)
        return Qwen3ForCausalLM(cfg), cfg
    cfg = Qwen2Config(**common)
    return Qwen2ForCausalLM(cfg), cfg


def _expected(name: str) -> ShardRule:
    """Hand-written table of what each Qwen parameter must get."""
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return ShardRule("column", 0, units=HEADS)
    if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
        return ShardRule("column", 0, units=KV, replicate_units=True)
    if name.endswith("o_proj.weight"):
        return ShardRule("row", 1, units=HEADS)
    if name.endswith(("gate_proj.weight", "up_proj.weight")):
        return ShardRule("column", 0)
    if name.endswith("down_proj.weight"):
        return ShardRule("row", 1)
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return ShardRule("vocab", 0)
    assert "norm" in name, name
    return REPLICATED


@pytest.mark.parametrize("kind", ["qwen3", "qwen2"])
@pytest.mark.parametrize("tied", [True, False])
def test_qwen_rules_match_table(kind: str, tied: bool) -> None:
    model, cfg = _qwen(kind, tied)
    rules = infer_model_rules(model, cfg)
    assert ("lm_head.weight" in rules) is not tied  # a tied head is the embedding, not a parameter
    for name, rule in rules.items():
        assert rule == _expected(name), name
    names = set(rules)
    if kind == "qwen3":
        assert "model.layers.0.self_attn.q_norm.weight" in names
        assert "model.layers.0.self_attn.q_proj.bias" not in names
    else:
        assert "model.layers.0.self_attn.q_proj.bias" in names
    # the tied head as it appears in a state dict still gets the vocab rule
    assert infer_rule("lm_head.weight", (96, HIDDEN), None, cfg) == ShardRule("vocab", 0)


def test_row_parallel_bias_is_replicated_and_qwen2_qkv_bias_column() -> None:
    _, cfg = _qwen("qwen2", False)
    assert infer_rule("model.layers.0.self_attn.o_proj.bias", (HIDDEN,), "Linear", cfg) == REPLICATED
    assert infer_rule("model.layers.0.mlp.down_proj.bias", (HIDDEN,), "Linear", cfg) == REPLICATED
    bias = infer_rule("model.layers.0.self_attn.k_proj.bias", (KV * HEAD_DIM,), "Linear", cfg)
    assert (bias.kind, bias.dim) == ("column", 0)
    # kv=2 heads of 4 rows at tp=4: ranks 0,1 share head 0 and ranks 2,3 head 1 (vLLM)
    assert [slice_for(bias, (8,), t, 4).ranges for t in range(4)] == [((0, 4),), ((0, 4),), ((4, 8),), ((4, 8),)]


MEGATRON_CFG = dict(num_attention_heads=8, num_query_groups=2, kv_channels=4, hidden_size=32, gated_linear_unit=True)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("decoder.layers.0.self_attention.linear_qkv.weight",
         ShardRule("column", 0, "qkv_grouped", num_heads=8, num_groups=2, head_dim=4)),
        ("module.decoder.layers.3.mlp.linear_fc1.weight", ShardRule("column", 0, "gated", stride=2)),
        ("decoder.layers.0.self_attention.linear_proj.weight", ShardRule("row", 1, units=8)),
        ("decoder.layers.0.self_attention.linear_proj.bias", REPLICATED),
        ("decoder.layers.0.mlp.linear_fc2.weight", ShardRule("row", 1)),
        ("embedding.word_embeddings.weight", ShardRule("vocab", 0)),
        ("output_layer.weight", ShardRule("vocab", 0)),
        ("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", REPLICATED),
        ("decoder.layers.0.mlp.linear_fc1.layer_norm_weight", REPLICATED),
        ("decoder.layers.0.self_attention.k_layernorm.weight", REPLICATED),
        ("decoder.final_layernorm.weight", REPLICATED),
    ],
)
def test_megatron_names(name: str, expected: ShardRule) -> None:
    shape = (10,) if ("norm" in name or name.endswith("bias")) else (10, 10)
    assert infer_rule(name, shape, None, MEGATRON_CFG) == expected


def test_megatron_non_gated_fc1_is_plain() -> None:
    cfg = dict(MEGATRON_CFG, gated_linear_unit=False)
    assert infer_rule("decoder.layers.0.mlp.linear_fc1.weight", (4, 4), None, cfg) == ShardRule("column", 0)


def test_attributes_decide_kind_and_stride() -> None:
    col2 = {"tensor_model_parallel": True, "partition_dim": 0, "partition_stride": 2}
    assert infer_rule("blk.proj.weight", (8, 4), "ColumnParallelLinear", None, col2) == ShardRule(
        "column", 0, "gated", stride=2)
    row = {"tensor_model_parallel": True, "partition_dim": 1, "partition_stride": 1}
    assert infer_rule("blk.out.weight", (4, 8), "RowParallelLinear", None, row) == ShardRule("row", 1)
    assert infer_rule("blk.out.bias", (4,), "RowParallelLinear", None, megatron_attrs(object())) == REPLICATED
    assert infer_rule("emb.weight", (16, 4), "VocabParallelEmbedding", None, {**row, "partition_dim": 0}) == \
        ShardRule("vocab", 0)


def test_unclassifiable_and_conflicting_parameters_raise() -> None:
    with pytest.raises(ValueError, match="cannot infer a shard rule for 'model.mystery.weight'"):
        infer_rule("model.mystery.weight", (4, 4), "Linear", None)
    row_attrs = {"tensor_model_parallel": True, "partition_dim": 1, "partition_stride": 1}
    with pytest.raises(ValueError, match="module says row"):
        infer_rule("model.layers.0.self_attn.q_proj.weight", (4, 4), "RowParallelLinear", None, row_attrs)
    with pytest.raises(ValueError, match="fused QKV needs the model config"):
        infer_rule("decoder.layers.0.self_attention.linear_qkv.weight", (4, 4), None, None)
    with pytest.raises(ValueError, match="gated layout needs stride"):
        ShardRule("column", 0, "gated")
    with pytest.raises(ValueError, match="row rule must shard dim 1"):
        ShardRule("row", 0)
    with pytest.raises(ValueError, match="not divisible by query groups"):
        ShardRule("column", 0, "qkv_grouped", num_heads=6, num_groups=4, head_dim=2)


# -- megatron-core TP layers on gloo, world size 2 --------------------------------------------

def _unique(shape: tuple[int, ...]) -> torch.Tensor:
    """Every element its own value, so a slice's values say exactly where it came from."""
    return torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape)


def _grouped(full: torch.Tensor, heads: int, groups: int, d: int) -> torch.Tensor:
    """[Q; K; V] rows -> megatron's per-group [q heads, k, v] order (written from its docs)."""
    hpg, rows = heads // groups, []
    for g in range(groups):
        rows += [full[g * hpg * d:(g + 1) * hpg * d], full[(heads + g) * d:(heads + g + 1) * d],
                 full[(heads + groups + g) * d:(heads + groups + g + 1) * d]]
    return torch.cat(rows)


def _megatron_worker(rank: int, rendezvous: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    try:
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
        from megatron.core.transformer.transformer_config import TransformerConfig

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)

        def check(name: str, layer: torch.nn.Module, full: torch.Tensor, cfg: object) -> None:
            for pname, p in layer.named_parameters():
                rule = infer_rule(f"{name}.{pname}", tuple(p.shape), type(layer).__name__, cfg, megatron_attrs(p))
                if pname == "weight":
                    expect = split_full(full, rule, 2)[rank]
                    assert torch.equal(p.detach(), expect), f"{name}: rank {rank} holds other rows"
                elif type(layer).__name__ == "RowParallelLinear":
                    assert rule == REPLICATED, f"{name}.bias: {rule}"
                else:
                    assert rule.kind == "column" and rule.stride == getattr(p, "partition_stride"), rule

        for groups in (2, 1):  # query groups >= tp and < tp
            heads, d, hidden = 4, 8, 16
            cfg = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=heads,
                                    num_query_groups=groups, kv_channels=d, ffn_hidden_size=24,
                                    gated_linear_unit=True, tensor_model_parallel_size=2,
                                    use_cpu_initialization=True, params_dtype=torch.float32)
            qkv_full = _unique(((heads + 2 * groups) * d, hidden))
            qkv = ColumnParallelLinear(hidden, qkv_full.shape[0], config=cfg, bias=True, gather_output=False,
                                       init_method=lambda w: w.copy_(_grouped(qkv_full, heads, groups, d)))
            check("decoder.layers.0.self_attention.linear_qkv", qkv, qkv_full, cfg)
        fc1_full = _unique((48, hidden))  # [gate; up] rows, as HF stores them
        fc1 = ColumnParallelLinear(hidden, 48, config=cfg, bias=True, gather_output=False, stride=2,
                                   init_method=lambda w: w.copy_(fc1_full))
        check("decoder.layers.0.mlp.linear_fc1", fc1, fc1_full, cfg)
        check("blocks.0.anonymous", fc1, fc1_full, None)  # attributes alone: stride 2 -> gated
        row_full = _unique((hidden, 24))
        row = RowParallelLinear(24, hidden, config=cfg, bias=True, input_is_parallel=True, skip_bias_add=False,
                                init_method=lambda w: w.copy_(row_full))
        check("decoder.layers.0.mlp.linear_fc2", row, row_full, cfg)
        emb_full = _unique((64, hidden))
        emb = VocabParallelEmbedding(64, hidden, config=cfg, init_method=lambda w: w.copy_(emb_full))
        check("embedding.word_embeddings", emb, emb_full, cfg)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_megatron_tp2_layers_hold_the_inferred_slices(tmp_path) -> None:
    pytest.importorskip("megatron.core.tensor_parallel", reason="megatron-core not importable (GPU extra)",
                        exc_type=ImportError)
    from megatron_ranks import launch

    launch(_megatron_worker, (f"file://{tmp_path}/rendezvous",), nprocs=2)
