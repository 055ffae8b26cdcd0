"""Hugging Face Qwen3 <-> megatron-core names and fused layouts, both ways bit-exact, for the
whole model and for each tensor-parallel rank's shard; bad layouts refused by name."""
from __future__ import annotations

import pytest
import torch

from executors.training.qwen_megatron import Heads, to_hf, to_megatron
from core.config import TrainConfig, TrainParallel
from storage.shards.plan import split_full
from storage.shards.rules import infer_rule


def _hf(layers: int = 2):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, intermediate_size=64, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg)
    return cfg, {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}


def _bits_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n].view(torch.int16), b[n].view(torch.int16)) for n in a)


def test_whole_model_both_ways_bit_exact() -> None:
    cfg, hf = _hf()
    h = Heads(4, 2, 8)
    mc = to_megatron(hf, h)
    assert "decoder.layers.1.self_attention.linear_qkv.weight" in mc and not any("q_proj" in n for n in mc)
    assert mc["decoder.layers.0.mlp.linear_fc1.weight"].shape == (128, 32)
    assert _bits_equal(to_hf(mc, h), hf)


def test_each_tp_rank_holds_megatrons_own_slices() -> None:
    """A rank's fused QKV and fc1, built from its Hugging Face slices, are the slices the shard
    rules say megatron-core holds (rules checked against real megatron layers elsewhere)."""
    cfg, hf = _hf()
    for tp in (1, 2):
        local_heads = Heads(4, 2, 8).local(tp)
        for r in range(tp):
            mine = {n: split_full(t, infer_rule(n, t.shape, None, cfg), tp)[r] for n, t in hf.items()}
            mc = to_megatron(mine, local_heads)
            qkv_full = torch.cat([hf[f"model.layers.0.self_attn.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")])
            rule = infer_rule("decoder.layers.0.self_attention.linear_qkv.weight", qkv_full.shape, None, cfg)
            assert torch.equal(mc["decoder.layers.0.self_attention.linear_qkv.weight"],
                               split_full(qkv_full, rule, tp)[r])
            fc1_full = torch.cat([hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]])
            rule = infer_rule("decoder.layers.0.mlp.linear_fc1.weight", fc1_full.shape, None, cfg)
            assert torch.equal(mc["decoder.layers.0.mlp.linear_fc1.weight"], split_full(fc1_full, rule, tp)[r])
            assert _bits_equal(to_hf(mc, local_heads), mine)


def test_pipeline_stage_numbers_its_own_layers() -> None:
    _, hf = _hf(layers=4)
    stage1 = {n: t for n, t in hf.items() if ".layers.2." in n or ".layers.3." in n or n == "model.norm.weight"}
    mc = to_megatron(stage1, Heads(4, 2, 8), layer_offset=2)
    assert {n.split(".")[2] for n in mc if n.startswith("decoder.layers.")} == {"0", "1"}
    assert _bits_equal(to_hf(mc, Heads(4, 2, 8), layer_offset=2), stage1)
    # a last stage's copy of a tied embedding goes out under the embedding's name
    out = to_hf({"output_layer.weight": hf["model.embed_tokens.weight"]}, Heads(4, 2, 8), tied=True)
    assert list(out) == ["model.embed_tokens.weight"]


def test_bad_layouts_and_names_are_refused_by_name() -> None:
    from executors.training.megatron_model import check_layout

    cfg, hf = _hf()
    with pytest.raises(ValueError, match="tensor parallel 4 must divide the 4 attention heads and the 2"):
        check_layout(TrainParallel(tp=4), cfg)
    with pytest.raises(ValueError, match="pipeline parallel 3 must divide the 2 layers"):
        check_layout(TrainParallel(pp=3), cfg)
    check_layout(TrainParallel(tp=2, pp=2, dp=3), cfg)
    with pytest.raises(ValueError, match="needs train.backend: megatron"):
        TrainConfig(parallel=TrainParallel(tp=2))
    with pytest.raises(KeyError, match="model.layers.0.mlp.mystery.weight"):
        to_megatron({"model.layers.0.mlp.mystery.weight": torch.zeros(1)}, Heads(4, 2, 8))
    with pytest.raises(KeyError, match="q/k/v"):
        to_megatron({"model.layers.0.self_attn.q_proj.weight": hf["model.layers.0.self_attn.q_proj.weight"]},
                    Heads(4, 2, 8))


def test_a_trainer_group_rendezvous_that_is_no_url_is_refused_by_name() -> None:
    from executors.training.process_group import join

    with pytest.raises(ValueError, match="127.0.0.1:29500"):
        join(0, TrainParallel(), "127.0.0.1:29500")
