"""A TP=2 megatron-core trainer (two gloo processes, each publishing its own shards) to a TP=1
vLLM engine: the receiver reassembles the unsharded model and the engine then computes with
exactly those weights, bit for bit (read back from its packed GEMM copies,
executors/engine/weights_view.py), after a full version and after a delta."""
from __future__ import annotations

import shutil

import pytest
import torch

from core.config import ModelsConfig
from rose.models.build import build_models
from storage.relay.filesystem import FilesystemRelay
from storage.weights.sharded_receiver import ShardedReceiver
from tests.tiny_models import TINY

from test_engine_reload import _same as _mismatches  # names whose engine-side weight differs
from test_sharded_publish import DIMS, _megatron_rank, _step, _tiny

# vLLM CPU attention needs a head size it has kernels for (32, as the project's tiny policy);
# two KV heads so that megatron's TP=2 splits them
VLLM_DIMS = {**DIMS, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32}



@pytest.mark.slow
@pytest.mark.models
@pytest.mark.timeout(600)
def test_megatron_tp2_trainer_to_a_tp1_vllm_engine_bit_exact(tmp_path) -> None:
    pytest.importorskip("megatron.core.tensor_parallel", reason="megatron-core not importable",
                        exc_type=ImportError)
    from megatron_ranks import launch

    from executors.engine.vllm_engine import EngineLoop, EngineSpec, reload_weights
    from executors.engine.weights_view import HEAD, engine_weights

    built = build_models(ModelsConfig(policy_dir=tmp_path / "built" / "policy",
                                      serving_dir=tmp_path / "built" / "serving"), spec=TINY)[0]
    model_dir = tmp_path / "policy"
    shutil.copytree(built, model_dir)  # its tokenizer; the model is the one the trainer shards
    hf, v0 = _tiny(VLLM_DIMS)
    hf.to(torch.bfloat16).save_pretrained(model_dir)
    launch(_megatron_rank, (f"file://{tmp_path}/rendezvous", str(tmp_path / "relay"), VLLM_DIMS), nprocs=2)

    receiver = ShardedReceiver(FilesystemRelay(tmp_path / "relay"), "tp2")
    assert receiver.pull(0).mode == "full"
    v1 = {n: _step(t) for n, t in v0.items()}
    assert receiver.pull().mode == "delta" and receiver.version == 1
    with_head = lambda w: {**w, HEAD: w["model.embed_tokens.weight"]}  # noqa: E731 (tied)
    loop = EngineLoop(EngineSpec(model_dir, max_model_len=256), "sharded", "rollout")
    try:
        assert _mismatches(loop.call(engine_weights), with_head(v0)) == []  # as started
        loop.call(lambda engine: reload_weights(engine, receiver.tensors))
        assert _mismatches(loop.call(engine_weights), with_head(v1)) == []
    finally:
        loop.close()
