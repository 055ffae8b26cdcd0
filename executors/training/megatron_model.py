"""The policy as one megatron-core rank holds it: a GPT model (local layer spec, no Transformer
Engine) built from a Hugging Face Qwen2/Qwen3 config, loaded from full Hugging Face tensors and
exported back as this rank's Hugging Face-named shards. Needs megatron's parallel state
initialised (executors/training/process_group.py).
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from executors.training.qwen_megatron import Heads, to_hf, to_megatron
from core.config import TrainParallel
from storage.shards.layout import layer_stages, stages_of
from storage.shards.plan import split_full
from storage.shards.rules import infer_rule


def check_layout(par: TrainParallel, hf_config: Any) -> None:
    """A clear error for a layout the model cannot take, before any process starts."""
    heads_of(hf_config).local(par.tp)
    layers, vocab = int(hf_config.num_hidden_layers), int(hf_config.vocab_size)
    if layers % par.pp:
        raise ValueError(f"pipeline parallel {par.pp} must divide the {layers} layers")
    if vocab % par.tp:
        raise ValueError(f"tensor parallel {par.tp} must divide the vocabulary ({vocab})")


def heads_of(hf_config: Any) -> Heads:
    heads = int(hf_config.num_attention_heads)
    head_dim = getattr(hf_config, "head_dim", None) or int(hf_config.hidden_size) // heads
    return Heads(heads, int(getattr(hf_config, "num_key_value_heads", None) or heads), int(head_dim))


def transformer_config(hf_config: Any, par: TrainParallel, dtype: torch.dtype = torch.float32):
    """megatron-core's TransformerConfig for a Qwen2/Qwen3 model (Qwen3: q/k norms, no qkv bias)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    h = heads_of(hf_config)
    qwen3 = hf_config.model_type == "qwen3"
    return TransformerConfig(
        num_layers=int(hf_config.num_hidden_layers), hidden_size=int(hf_config.hidden_size),
        ffn_hidden_size=int(hf_config.intermediate_size), num_attention_heads=h.heads,
        num_query_groups=h.groups, kv_channels=h.head_dim,
        normalization="RMSNorm", layernorm_epsilon=float(hf_config.rms_norm_eps),
        qk_layernorm=qwen3, add_bias_linear=False,
        add_qkv_bias=bool(getattr(hf_config, "attention_bias", not qwen3)),
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=par.tp, pipeline_model_parallel_size=par.pp, pipeline_dtype=dtype,
        params_dtype=dtype, use_cpu_initialization=True, perform_initialization=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        bf16=dtype == torch.bfloat16,
    )


def _rope_theta(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(hf_config, "rope_theta", 10000.0))


class RankModel:
    """One rank's GPT model and the name/layout bookkeeping around it."""

    def __init__(self, hf_config: Any, par: TrainParallel, device: str = "cpu") -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        check_layout(par, hf_config)
        self.hf_config, self.par = hf_config, par
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        self.dp_rank = ps.get_data_parallel_rank()
        self.heads = heads_of(hf_config)
        self.tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        stages = layer_stages(int(hf_config.num_hidden_layers), par.pp)
        self.layer_offset = stages.index(self.pp_rank)
        self.first, self.last = self.pp_rank == 0, self.pp_rank == par.pp - 1
        self.config = transformer_config(hf_config, par)
        spec = get_gpt_layer_local_spec(qk_layernorm=self.config.qk_layernorm, normalization="RMSNorm")
        gpt = GPTModel if device != "cpu" else _host_gpt()
        self.model = gpt(
            config=self.config, transformer_layer_spec=spec, vocab_size=int(hf_config.vocab_size),
            max_sequence_length=int(hf_config.max_position_embeddings),
            pre_process=self.first, post_process=self.last, parallel_output=True,
            share_embeddings_and_output_weights=self.tied, position_embedding_type="rope",
            rotary_base=_rope_theta(hf_config)).to(device)
        if device == "cpu" and getattr(self.model, "rotary_pos_emb", None) is not None:
            _rope_on_cpu(self.model.rotary_pos_emb)

    def load_hf(self, full: dict[str, torch.Tensor]) -> None:
        """Copy this rank's slices of the full Hugging Face tensors into the model."""
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in self.local_megatron(full).items():
                params[name].copy_(t.to(params[name].dtype))

    def local_megatron(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's tensors, under the model's own names, from full Hugging Face tensors (the
        weights, or anything shaped like them: AdamW's moments): each cut to this TP rank by
        its Hugging Face rule, then fused the way megatron-core holds it."""
        stage = {n: t for n, t in full.items() if self.on_stage(n)}
        mine = {n: split_full(t, infer_rule(n, tuple(t.shape), None, self.hf_config),
                              self.par.tp)[self.tp_rank] for n, t in stage.items()}
        local = to_megatron(mine, self.heads.local(self.par.tp), self.layer_offset)
        if self.tied and self.last and not self.first:
            local["output_layer.weight"] = local.pop("embedding.word_embeddings.weight")
        params = dict(self.model.named_parameters())
        if sorted(local) != sorted(params):
            raise KeyError(f"checkpoint and model differ: missing {sorted(set(params) - set(local))[:3]}, "
                           f"unexpected {sorted(set(local) - set(params))[:3]}")
        for name, p in params.items():
            if tuple(local[name].shape) != tuple(p.shape):
                raise ValueError(f"{name}: this rank's slice is {tuple(local[name].shape)}, "
                                 f"the model holds {tuple(p.shape)}")
        return local

    def hf_names(self) -> list[str]:
        """The Hugging Face parameters this rank's stage holds (a slice of each)."""
        return list(self.local_hf(None))

    def on_stage(self, hf_name: str) -> bool:
        return self.pp_rank in stages_of(hf_name, int(self.hf_config.num_hidden_layers), self.par.pp,
                                         self.tied)

    def local_hf(self, dtype: torch.dtype | None = torch.bfloat16,
                 tensors: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """This rank's shards under Hugging Face names and layouts (what its publisher pushes);
        `tensors`: others shaped like the parameters (by parameter name), e.g. AdamW moments."""
        held = tensors if tensors is not None else {n: p.detach() for n, p in self.model.named_parameters()}
        held = {n: (t if dtype is None else t.to(dtype)) for n, t in held.items()}
        return to_hf(held, self.heads.local(self.par.tp), self.layer_offset, tied=self.tied)


@functools.cache
def _host_gpt():
    """GPTModel for a CPU trainer: megatron-core gives the last pipeline stage the first
    stage's tied embedding through a CUDA all-reduce at construction; here both stages load it
    from the checkpoint instead (RankModel.load_hf), and are kept equal by summing their
    gradients (MegatronTrainer)."""
    from megatron.core.models.gpt import GPTModel

    class HostGPTModel(GPTModel):
        def setup_embeddings_and_output_layer(self) -> None:
            if self.config.pipeline_model_parallel_size == 1 or not self.share_embeddings_and_output_weights:
                return super().setup_embeddings_and_output_layer()
            weight = self.shared_embedding_or_output_weight()
            if weight is not None:
                weight.shared_embedding = True
                weight.shared = not self.pre_process

    return HostGPTModel


def _rope_on_cpu(rope: Any) -> None:
    """megatron-core moves the rotary frequencies to CUDA on first use; on a CPU trainer they
    stay where they are (the same frequencies, not interleaved, as Qwen uses)."""
    if rope.rotary_interleaved:
        raise ValueError("interleaved rotary embeddings are not supported on a CPU trainer")

    def get_emb(max_seq_len: int, offset: int = 0) -> torch.Tensor:
        freqs = rope.get_freqs_non_repeated(max_seq_len, offset)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]

    rope.get_emb = get_emb
