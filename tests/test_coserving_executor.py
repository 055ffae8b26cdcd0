"""The co-serving executor on real engines (slow) and its profile cache and config (fast).

Slow tests share one executor (module fixture, run in file order: no serving traffic before
the burst test, so its first budget is exact) on a small emulated device:
kv_blocks=64 per engine (63 usable pages), max_model_len 1024, 32-token rollout chunks.
Hand-computed KV numbers used below (reserve 20%, watermark half the reserve, cut by 2):
  reserve = ceil(0.2 * 63) = 13 pages; idle-step budget = 63 - 13 = 50 pages; after a cut 25.
  A rollout block is 4/3 pages (policy: 4 layers vs serving: 3 layers, same KV heads/dims).
  A 1000-token rollout prompt = 32 blocks = 43 pages (fits 50, not 25, not 32).
  A 550-token serving prompt + 8 tokens = 18 blocks > watermark 63 - 50 - 13 + 6.5 = 6.5.
  After that burst, start_step's budget = 63 - 13 - 18 = 32 pages < 43: the next 1000-token
  rollout prompt cannot finish its prefill, so it stalls.
"""
from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path

import pytest

from core.config import vllm_cache_dir
from executors.coserving.config import CoServingConfig
from tests.stack_fixtures import shared_models
from executors.coserving.profile import load_or_measure, profile_path
from executors.policies.latency_profile import Curve, LatencyProfile


def _model_source() -> Path | None:
    for root in (os.environ.get("ROSE_TEST_DATA_DIR"), os.environ.get("ROSE_DATA_DIR")):
        if root and (Path(root) / "models" / "policy" / "config.json").is_file():
            return Path(root) / "models"
    return None


def _profile(scale: float = 1.0) -> LatencyProfile:
    curve = Curve((16, 512), (0.01 * scale, 0.05 * scale))
    return LatencyProfile(curve, curve, Curve((1, 8), (0.002, 0.004)), 16, "fake")


# ---- fast ----------------------------------------------------------------------------------
def test_profile_cache_measures_once_then_reads(tmp_path):
    model = tmp_path / "policy"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 4}')
    calls = []
    def measure():
        calls.append(1)
        return _profile()

    path = profile_path(model, {"chunk_tokens": 16})
    assert path.parent == tmp_path and path.name.startswith("policy.profile-")
    first, src1 = load_or_measure(path, measure)
    second, src2 = load_or_measure(path, measure)
    assert (src1, src2) == ("measured", "cached") and len(calls) == 1
    assert second.prefill(16) == first.prefill(16) == 0.01
    # other settings or another architecture: another file
    assert profile_path(model, {"chunk_tokens": 32}) != path
    (model / "config.json").write_text('{"num_hidden_layers": 8}')
    assert profile_path(model, {"chunk_tokens": 16}) != path
    # a torn cache file is measured over, not trusted
    path.write_text("{not json")
    _, src3 = load_or_measure(path, measure)
    assert src3 == "measured" and len(calls) == 2


def test_step_plan_costs_and_blocks_by_hand():
    from executors.policies.step_plan import blocks_wanted, plan_steps

    curve = Curve((16, 512), (0.01, 0.05))  # slope 0.04 s / 496 tokens
    prof = LatencyProfile(curve, curve, Curve((1, 8), (0.002, 0.004)), 512, "hand")
    d3 = 0.002 + 0.002 * 2 / 7  # D(3)
    full, decode = plan_steps(3, 1000, 1, 32, prof, 512)
    assert (full.kind, full.tokens, full.blocks) == ("prefill_chunk", 512, 16 + 1 + 1)
    assert full.cost_s == pytest.approx(0.05) and decode.cost_s == pytest.approx(d3)
    assert (decode.tokens, decode.blocks) == (3, 1)
    assert blocks_wanted(3, 1000, 1, 32, 512) == 18
    # 10 blocks of room: the chunk shrinks to 8 whole blocks of prefill (+1 straddle, +1 decode)
    small, _ = plan_steps(3, 1000, 1, 32, prof, 512, room_blocks=10)
    assert (small.tokens, small.blocks) == (3 + 8 * 32, 10)
    assert small.cost_s == pytest.approx(0.01 + 0.04 * (259 - 16) / 496)
    assert [p.kind for p in plan_steps(3, 1000, 1, 32, prof, 512, room_blocks=2)] == ["decode"]
    assert plan_steps(0, 0, 0, 32, prof, 512) == []
    (mono,) = plan_steps(0, 2000, 0, 32, prof, None)  # SLO-unaware: the whole prompt at once
    assert (mono.tokens, mono.blocks) == (2000, 63 + 1)
    assert mono.cost_s == pytest.approx(0.05 + 0.04 * 1488 / 496)


def test_step_plan_counts_whole_sequence_admission_and_preempts_when_wedged():
    """Found in the co-serving bench: (1) vLLM admits a waiting turn only when its whole
    prompt fits the free blocks, so a one-chunk plan (17 blocks here) under a room of 30 made
    an empty step, and leases were reclaimed only down to one chunk; (2) running turns that
    filled the room waited for a block (a decode at a block boundary) no plan could get, so no
    step ran, vLLM never preempted, and the stall detector aborted every live turn."""
    from executors.policies.step_plan import blocks_wanted, plan_steps

    curve = Curve((16, 512), (0.01, 0.05))
    prof = LatencyProfile(curve, curve, Curve((1, 8), (0.002, 0.004)), 512, "hand")
    # a waiting 1656-token turn needs 52 free blocks to be admitted (its first chunk: 17)
    assert plan_steps(0, 1656, 0, 32, prof, 512, room_blocks=30, admit_blocks=52) == []
    (full,) = plan_steps(0, 1656, 0, 32, prof, 512, room_blocks=60, admit_blocks=52)
    assert (full.kind, full.tokens, full.blocks) == ("prefill_chunk", 512, 52)
    assert blocks_wanted(0, 1656, 0, 32, 512, admit_blocks=52) == 52  # what leases yield to
    assert blocks_wanted(0, 1656, 0, 32, 512) == 17
    # with decodes running, the step is their decode step until the waiting turn fits
    assert [p.kind for p in plan_steps(4, 1656, 1, 32, prof, 512, room_blocks=30,
                                       admit_blocks=52)] == ["decode"]
    # 12 decodes, 3 at a block boundary, 1 block of room, 600 held: vLLM preempts within it
    (pre,) = plan_steps(12, 0, 3, 32, prof, 512, room_blocks=1, held_blocks=600)
    assert (pre.kind, pre.tokens, pre.blocks) == ("preempt", 12, 1)
    assert pre.cost_s == pytest.approx(plan_steps(12, 0, 3, 32, prof, 512)[0].cost_s)
    # running prefills (no admission needed) that filled the room: a full chunk, preempting
    (pre,) = plan_steps(0, 500, 0, 32, prof, 512, room_blocks=0, held_blocks=40)
    assert (pre.kind, pre.tokens, pre.blocks) == ("preempt", 500, 0)
    # nothing held: nothing to preempt, wait for room
    assert plan_steps(12, 0, 3, 32, prof, 512, room_blocks=1) == []


def test_evict_reload_trigger():
    from executors.policies.autoscale import EvictReload

    er = EvictReload(threshold=8, calm_s=2.0)
    assert er.tick(7, True, 0.0) is None  # below the burst threshold: stay up
    assert er.tick(8, True, 1.0) == "evict" and er.evictions == 1
    assert er.tick(5, False, 2.0) is None  # 5 > 8 // 2: still busy
    assert er.tick(4, False, 3.0) is None  # calm from t=3
    assert er.tick(9, False, 4.0) is None  # busy again: the calm clock restarts
    assert er.tick(4, False, 5.0) is None and er.tick(3, False, 6.9) is None
    assert er.tick(0, False, 7.0) == "reload"  # 2 s calm since t=5


def test_config_rejects_bad_values(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="mode\n  Input should be .rose."):
        CoServingConfig(model, model, mode="greedy")
    with pytest.raises(ValueError, match="kv_blocks=10 cannot hold"):
        CoServingConfig(model, model, kv_blocks=10)
    with pytest.raises(ValueError, match="reserve_fraction"):
        CoServingConfig(model, model, reserve_fraction=1.0)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        CoServingConfig(tmp_path / "missing", model)


# ---- slow: real engines ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    src = _model_source()
    if src is None:  # the session's models, built once (tests/stack_fixtures.py)
        os.environ.setdefault("ROSE_DATA_DIR", str(tmp_path_factory.mktemp("rose-data")))
        src = shared_models(tmp_path_factory)
    dst = tmp_path_factory.mktemp("coserving-models")  # fresh: profiles are measured here
    for name in ("policy", "serving"):
        shutil.copytree(src / name, dst / name)
    os.environ.setdefault("VLLM_CACHE_ROOT", str(vllm_cache_dir(src)))
    return dst


def _config(models: Path, **kw) -> CoServingConfig:
    base = dict(mode="rose", kv_blocks=64, max_model_len=1024, chunk_tokens=32, max_num_seqs=8,
                profile_repeats=1, lease_s=2.0, stall_timeout_s=5.0, usage_window_s=600.0)
    return CoServingConfig(models / "serving", models / "policy", **{**base, **kw})


@pytest.fixture(scope="module")
def executor(models):
    from executors.coserving.executor import CoServingExecutor

    ex = CoServingExecutor(_config(models))
    yield ex
    ex.close()


def _prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 400) for _ in range(n)]


def _turn(tid: str, n: int, seed: int, max_tokens: int = 4):
    from executors.turns import TurnRequest
    return TurnRequest(f"{tid}/t0/a0", tid, _prompt(n, seed), max_tokens, temperature=1.0, seed=seed)


def _wait(pred, timeout: float = 60.0, every: float = 0.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError("condition not reached in time")


@pytest.mark.slow
@pytest.mark.models
def test_rollout_turns_complete_when_serving_is_idle_and_leases_expire(executor):
    turns = [_turn(f"idle-{i}", 64, i) for i in range(3)]
    results = [f.result(timeout=120) for f in [executor.submit_rollout(t) for t in turns]]
    for t, r in zip(turns, results):
        assert r.ok and r.worker_kind == "serving" and r.trajectory_id == t.trajectory_id
        assert 0 < len(r.response_ids) <= 4 and len(r.logprobs) == len(r.response_ids)
        assert r.num_prompt_tokens == 64
    m = executor.metrics(fresh=True)
    assert m["kv"]["rollout_request_blocks"] == 0  # every finished turn gave its blocks back
    # each turn left its 2 full prompt blocks (3 pages; 64 + <= 4 tokens) cached, leased 2 s
    assert m["kv"]["leases"] + m["rollout"]["leases_expired"] == 3
    assert m["kv"]["rollout_prefix_blocks"] == 3 * m["kv"]["leases"]
    _wait(lambda: executor.metrics(fresh=True)["rollout"]["leases_expired"] == 3, 30, 0.1)
    m = executor.metrics(fresh=True)
    assert m["kv"]["rollout_prefix_blocks"] == 0 and m["rollout"]["lease_blocks_evicted"] == 6


@pytest.mark.slow
@pytest.mark.models
def test_serving_burst_cuts_and_aborts_rollout_then_freezes(executor):
    executor.start_step()
    m = executor.metrics(fresh=True)
    assert (m["kv"]["budget_blocks"], m["kv"]["state"]) == (50, "normal")
    long_turn = executor.submit_rollout(_turn("burst", 1000, 7))
    _wait(lambda: executor.metrics(fresh=True)["kv"]["rollout_request_blocks"] >= 27)
    burst = executor.submit_serving(_prompt(550, 1), 8, ignore_eos=True)
    r = long_turn.result(timeout=60)
    assert r.finished_reason == "abort" and not r.ok  # reroutable
    m = executor.metrics(fresh=True)
    assert m["kv"]["cuts"] == 1 and m["rollout"]["aborted_cut"] == 1
    assert m["kv"]["state"] == "frozen" and m["kv"]["budget_blocks"] == 25
    assert len(burst.result(timeout=60).output_ids) == 8  # serving was never disturbed
    executor.start_step()
    m = executor.metrics(fresh=True)
    assert m["kv"]["state"] == "normal" and m["kv"]["budget_blocks"] == 63 - 13 - 18


@pytest.mark.slow
@pytest.mark.models
def test_rollout_that_cannot_progress_is_reported_stalled(executor):
    before = executor.metrics(fresh=True)["rollout"]["aborted_stall"]
    t0 = time.monotonic()
    r = executor.submit_rollout(_turn("stuck", 1000, 8)).result(timeout=60)
    assert r.finished_reason == "abort" and time.monotonic() - t0 >= 5.0
    m = executor.metrics(fresh=True)
    assert m["rollout"]["aborted_stall"] == before + 1 and m["rollout"]["in_flight"] == 0
    assert m["kv"]["rollout_request_blocks"] == 0  # its partial prefill's blocks were freed


@pytest.mark.slow
@pytest.mark.models
def test_serving_requests_complete_with_their_token_counts(executor):
    streamed: dict[int, list[int]] = {5: [], 9: [], 1: []}
    futures = {n: executor.submit_serving(_prompt(40 + n, n), n, ignore_eos=True,
                                          on_token=lambda tok, t, n=n: streamed[n].append(tok))
               for n in streamed}
    for n, fut in futures.items():
        r = fut.result(timeout=120)
        assert len(r.output_ids) == n and r.finish_reason == "length"
        assert streamed[n] == r.output_ids and len(r.token_times) == n
        assert r.token_times == sorted(r.token_times) and r.first_token_at >= r.arrival
        assert r.ttft_s >= 0 and (n == 1 or r.tpot_s >= 0)
    for bad, why in (([], "empty prompt"), ([1, 10**6], "token ids outside"),
                     (_prompt(1020, 0), "exceeds the model's context")):
        with pytest.raises(ValueError, match=why):
            executor.submit_serving(bad, 8)


@pytest.mark.slow
@pytest.mark.models
def test_rollout_weights_load_in_place_and_stale_turns_are_refused(executor, models):
    from safetensors.torch import load_file

    original = load_file(str(models / "policy" / "model.safetensors"))
    changed = dict(original)
    changed["model.embed_tokens.weight"] = original["model.embed_tokens.weight"] * 2
    executor.load_rollout_weights(1, changed)
    assert executor.rollout_weight_matches(changed) is True
    assert executor.rollout_weight_matches(original) is False
    executor.load_rollout_weights(2, original)
    assert executor.rollout_weight_matches(original) is True
    assert executor.metrics(fresh=True)["version"] == 2
    stale = _turn("future", 20, 1)
    stale.min_policy_version = 3
    r = executor.submit_rollout(stale).result(timeout=30)
    assert r.finished_reason == "stale" and r.policy_version == 2
    ok = executor.submit_rollout(_turn("now", 20, 2)).result(timeout=60)
    assert ok.ok and ok.policy_version == 2


@pytest.mark.slow
@pytest.mark.models
def test_profiles_are_cached_next_to_the_models(executor, models):
    from executors.coserving.executor import CoServingExecutor

    m = executor.metrics()
    assert m["profiles"]["source"] == {"serving": "measured", "rollout": "measured"}
    assert "derived from the serving profile" in m["slo"]["source"]
    assert len(list(models.glob("serving.profile-*.json"))) == 1
    assert len(list(models.glob("policy.profile-*.json"))) == 1
    alone = CoServingExecutor(_config(models, mode="serving_only"))
    try:
        assert alone.metrics()["profiles"]["source"]["serving"] == "cached"
        assert not alone.admitting()
        r = alone.submit_rollout(_turn("nowhere", 20, 1)).result(timeout=30)
        assert r.finished_reason == "abort"
    finally:
        alone.close()
