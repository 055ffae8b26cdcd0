"""In-place weight reload must leave the vLLM engine sampling exactly as a fresh engine would.

Regression: vLLM CPU packs a tied LM head into a private GEMM copy at load; an in-place reload
updated the embeddings but not that copy, so rollouts ran a stale output head after every
publish (the policy the trainer improved was never the one sampled).
"""
from __future__ import annotations

import shutil

import pytest
import torch

from executors.turns import TurnRequest
from executors.engine.vllm_engine import EngineLoop, EngineSpec, reload_weights
from rose.config import ModelsConfig
from rose.models.build import build_models
from tests.tiny_models import TINY


def _greedy(loop: EngineLoop, prompt: list[int], tag: str) -> tuple[list[int], list[float]]:
    r = loop.submit(TurnRequest(tag, "t", prompt, 8, temperature=1e-5, seed=1)).result()
    return r.response_ids, r.logprobs


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return build_models(ModelsConfig(policy_dir=root / "policy", serving_dir=root / "serving"),
                        spec=TINY)[0]


@pytest.mark.slow
def test_reloaded_engine_samples_like_a_fresh_one(tmp_path, policy):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    assert model.config.tie_word_embeddings  # the case that went stale
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an update big enough to change every greedy choice's logprob
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    new = {n: p.detach().to(torch.bfloat16).contiguous() for n, p in model.named_parameters()}
    trained = tmp_path / "trained"
    shutil.copytree(policy, trained)
    model.to(torch.bfloat16).save_pretrained(trained)

    prompt = list(range(5, 40))
    loop = EngineLoop(EngineSpec(policy, max_model_len=256), "reloaded", "rollout")
    try:
        before = _greedy(loop, prompt, "a")
        loop.call(lambda engine: reload_weights(engine, new))
        after = _greedy(loop, prompt, "b")
    finally:
        loop.close()
    fresh_loop = EngineLoop(EngineSpec(trained, max_model_len=256), "fresh", "rollout")
    try:
        fresh = _greedy(fresh_loop, prompt, "c")
    finally:
        fresh_loop.close()
    assert before != fresh  # the update is visible at all
    assert after[0] == fresh[0]
    assert after[1] == pytest.approx(fresh[1], abs=1e-4)


@pytest.mark.slow
def test_a_failing_engine_fails_its_turns_instead_of_hanging(policy):
    loop = EngineLoop(EngineSpec(policy, max_model_len=256), "broken", "rollout")
    try:
        def explode():
            raise MemoryError("KV cache gone")
        loop.engine.step = explode  # the next engine step raises on the loop thread
        turn = loop.submit(TurnRequest("x", "t", [5, 6, 7], 4))
        with pytest.raises(RuntimeError, match="failed: MemoryError"):
            turn.result(timeout=30)
        with pytest.raises(RuntimeError, match="is down"):
            loop.submit(TurnRequest("y", "t", [5, 6, 7], 4)).result(timeout=5)
        with pytest.raises(RuntimeError, match="is down"):
            loop.call(lambda engine: None)
    finally:
        loop.close()
