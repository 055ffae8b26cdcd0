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
from core.config import ModelsConfig
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
@pytest.mark.models
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
@pytest.mark.models
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


@pytest.mark.slow
@pytest.mark.models
def test_reload_drops_the_prefix_cache_even_with_turns_in_flight(policy):
    """No turn mixes KV of two versions: a reload aborts the turns in flight, resets vLLM's
    prefix cache and reruns them whole on the new version."""
    import time

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    new = {n: p.detach().to(torch.bfloat16).contiguous() for n, p in model.named_parameters()}
    prompt = list(range(5, 80))  # two full 32-token blocks to hit
    loop = EngineLoop(EngineSpec(policy, max_model_len=512), "reload-cache", "rollout")
    try:
        loop.submit(TurnRequest("warm", "t", prompt, 1)).result()
        assert loop.submit(TurnRequest("hit", "t", prompt, 1)).result().num_cached_tokens >= 64
        running = [loop.submit(TurnRequest(f"long{i}", f"u{i}", [100 + i] + prompt[:-1], 420,
                                           seed=i)) for i in range(4)]
        deadline = time.monotonic() + 30
        while len(loop._live) < 4 and time.monotonic() < deadline:
            time.sleep(0.001)
        resubmitted = loop.reload(new, version=1)
        after = loop.submit(TurnRequest("after", "t", prompt, 1)).result()
        again = loop.submit(TurnRequest("again", "t", prompt, 1)).result()
        results = [f.result(timeout=60) for f in running]
    finally:
        loop.close()
    assert resubmitted >= 1  # turns were in flight when the reload landed
    assert after.num_cached_tokens == 0 and after.policy_version == 1
    assert again.num_cached_tokens >= 64  # the cache works again, on the new version only
    rerun = [r for r in results if r.policy_version == 1]
    assert len(rerun) == resubmitted
    assert all(len(r.logprobs) == len(r.response_ids) > 0 for r in results)


def _same(got: dict, want: dict) -> list[str]:
    """Names whose engine-side weight differs from `want` (bf16 -> fp32 is exact)."""
    return [n for n in sorted(set(got) | set(want)) if n not in got or n not in want
            or got[n].shape != want[n].shape or not torch.equal(got[n].float(), want[n].float())]


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("which", ["policy", "serving"])  # tied Qwen3; untied Qwen2 with biases
def test_engine_weights_read_what_the_engine_computes_with(policy, which):
    """executors/engine/weights_view.py reads the engine's packed GEMM copies, not the receiver's
    tensors: after a reload that skips the head re-pack (the old bug) it shows the stale head."""
    from transformers import AutoModelForCausalLM

    from executors.engine.weights_view import HEAD, engine_weights

    path = policy if which == "policy" else policy.parent / "serving"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    loaded = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
    tied = HEAD not in loaded
    embed = "model.embed_tokens.weight"
    gen = torch.Generator().manual_seed(0)
    new = {n: (t.float() + torch.randn(t.shape, generator=gen) * 0.05).to(torch.bfloat16)
           for n, t in loaded.items()}
    with_head = (lambda w: {**w, HEAD: w[embed]}) if tied else (lambda w: w)
    loop = EngineLoop(EngineSpec(path, max_model_len=256), f"view-{which}", "rollout")
    try:
        assert _same(loop.call(engine_weights), with_head(loaded)) == []
        if tied and not torch.cuda.is_available():  # vLLM CPU packs the tied head apart
            loop.call(lambda e: e.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": list(new.items())}))
            assert _same(loop.call(engine_weights), with_head(new)) == [HEAD]  # stale, and seen
        loop.call(lambda engine: reload_weights(engine, new))
        assert _same(loop.call(engine_weights), with_head(new)) == []
    finally:
        loop.close()
