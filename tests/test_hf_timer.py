"""The plain-PyTorch step timer behind `python -m bench.sim.engine_profile --backend torch` (CPU here; the
CUDA-graph half runs only on a GPU machine, where it measured sim/profiles/h100_*.json)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from executors.engine import hf_timer  # noqa: E402
from executors.policies.latency_profile import LatencyProfile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_shape(tmp_path_factory) -> Path:
    cfg = json.loads((ROOT / "sim/profiles/shapes/qwen3-8b/config.json").read_text())
    cfg.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=500, bos_token_id=1, eos_token_id=2)
    d = tmp_path_factory.mktemp("shape")
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_shipped_shapes_are_the_papers_models() -> None:
    for name, layers in (("qwen3-8b", 36), ("qwen3-32b", 64), ("qwen2.5-7b", 28)):
        cfg = json.loads((ROOT / "sim/profiles/shapes" / name / "config.json").read_text())
        assert cfg["num_hidden_layers"] == layers


def test_decode_attends_the_whole_context_each_run(tiny_shape) -> None:
    seen = []
    real = hf_timer._timing_attention

    def spy(module, q, k, v, mask, **kw):
        seen.append((q.shape[0], q.shape[2], k.shape[2], mask))
        return real(module, q, k, v, mask, **kw)

    model = hf_timer.build_random_model(tiny_shape, "cpu", torch.float32)
    from transformers import AttentionInterface
    AttentionInterface.register(hf_timer.TIMING_ATTENTION, spy)
    try:
        timer = hf_timer.HFForwardTimer(model, "cpu", repeats=2, decode_context=40)
        times = timer.decode([1, 3])
    finally:
        AttentionInterface.register(hf_timer.TIMING_ATTENTION, real)
    assert sorted(times.eager) == [1, 3] and not times.graphed  # no graphs off CUDA
    # every run (warm-up + 2 repeats) decodes one token against the same 40 + 1 keys: the
    # context does not grow from run to run, and no mask is built
    assert set(seen) == {(1, 1, 41, None), (3, 1, 41, None)}
    assert len(seen) == 2 * 3 * 2  # batches x runs x layers


def test_chunked_prefill_attends_the_growing_prefix(tiny_shape) -> None:
    seen = []
    real = hf_timer._timing_attention
    model = hf_timer.build_random_model(tiny_shape, "cpu", torch.float32)
    from transformers import AttentionInterface
    AttentionInterface.register(hf_timer.TIMING_ATTENTION,
                                lambda m, q, k, v, mask, **kw: seen.append((q.shape[2], k.shape[2]))
                                or real(m, q, k, v, mask, **kw))
    try:
        hf_timer.HFForwardTimer(model, "cpu", repeats=1).prefill([70], chunk=32)
    finally:
        AttentionInterface.register(hf_timer.TIMING_ATTENTION, real)
    assert sorted(set(seen)) == [(6, 70), (32, 32), (32, 64)]


def test_steps_after_a_cached_context_attend_it_and_their_own_tokens(tiny_shape) -> None:
    seen = []
    real = hf_timer._timing_attention
    model = hf_timer.build_random_model(tiny_shape, "cpu", torch.float32)
    from transformers import AttentionInterface
    AttentionInterface.register(hf_timer.TIMING_ATTENTION,
                                lambda m, q, k, v, mask, **kw: seen.append((q.shape[0], q.shape[2], k.shape[2]))
                                or real(m, q, k, v, mask, **kw))
    timer = hf_timer.HFForwardTimer(model, "cpu", repeats=1)
    try:
        chunks = timer.after_context([10, 50], batch=1, new_tokens=8)
        decodes = timer.after_context([30], batch=3)
    finally:
        AttentionInterface.register(hf_timer.TIMING_ATTENTION, real)
    assert sorted(chunks.eager) == [10, 50] and sorted(decodes.eager) == [30]
    # a chunk of 8 sees its prefix and itself; a decode of 3 requests sees 30 + 1; every run alike
    assert set(seen) == {(1, 8, 18), (1, 8, 58), (3, 1, 31)}
    with pytest.raises(ValueError, match="contexts >= 1"):
        timer.after_context([0])


def test_bad_timer_settings_are_refused(tiny_shape) -> None:
    model = hf_timer.build_random_model(tiny_shape, "cpu", torch.float32)
    with pytest.raises(ValueError, match="decode_context"):
        hf_timer.HFForwardTimer(model, "cpu", decode_context=0)


def test_engine_profile_torch_backend_writes_a_loadable_profile(tiny_shape, tmp_path) -> None:
    cmd = [sys.executable, "-m", "bench.sim.engine_profile", "--backend", "torch", "--model",
           str(tiny_shape), "--name", "tiny", "--out", str(tmp_path), "--max-model-len", "300",
           "--max-num-seqs", "4", "--repeats", "1", "--chunk-tokens", "64"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=300)
    saved = json.loads((tmp_path / "tiny.json").read_text())
    profile = LatencyProfile.load(tmp_path / "tiny.json")
    assert profile.decode.xs == (1.0, 2.0, 4.0) and profile.chunk_size == 64
    assert profile.monolithic.xs == (16.0, 64.0, 256.0, 284.0)
    assert "eager" in saved["source"] and saved["graphed_ms"]["decode"] == {}
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode != 0 and "--force" in again.stderr  # nothing written is lost


def test_train_profile_fits_the_full_depth_from_two_cut_models(tiny_shape, tmp_path) -> None:
    cmd = [sys.executable, "-m", "bench.sim.train_profile", "--model", str(tiny_shape), "--name", "t",
           "--out", str(tmp_path), "--tokens", "32", "--layers", "1", "2", "--repeats", "1"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, timeout=300)
    d = json.loads((tmp_path / "t.json").read_text())
    one, two = d["step_s"]["1"], d["step_s"]["2"]
    assert d["per_layer_s"] == pytest.approx(two - one)
    assert d["step_s_full_model"] == pytest.approx(one + (d["layers"] - 1) * (two - one))
    assert d["train_s_per_token"] == pytest.approx(d["step_s_full_model"] / 32)
    bad = subprocess.run(cmd[:-5] + ["--layers", "2", "2"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert bad.returncode != 0 and "two different depths" in bad.stderr


def test_context_check_compares_the_cost_beyond_the_512_point_with_the_terms() -> None:
    from bench.sim.context_cost_check import _rows
    from sim.fleet import context_cost, load_fleet

    terms = context_cost(load_fleet("h200_qwen3_8b"))
    measured = {512: 0.010, 8192: 0.010 + 2 * terms.decode_extra(16, 16 * 8192)}  # twice the terms' cost
    rows = _rows("decode", 16, measured, lambda c: terms.decode_extra(16, 16 * c))
    assert [r["context"] for r in rows] == [512, 8192] and rows[0]["ratio"] is None  # nothing beyond the base
    assert rows[1]["ratio"] == pytest.approx(2.0, rel=1e-3)
    assert rows[1]["extra_ms"] == pytest.approx(2 * rows[1]["predicted_extra_ms"], rel=1e-3)


def test_the_faster_way_per_size_is_kept() -> None:
    times = hf_timer.ForwardTimes(eager={2: 3.0, 1: 2.0}, graphed={1: 1.0, 2: 4.0})
    assert times.fastest() == {1: 1.0, 2: 3.0} and list(times.fastest()) == [1, 2]
