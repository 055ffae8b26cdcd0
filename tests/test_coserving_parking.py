"""Park and wake of the co-serving executor's rollout engine (executors/coserving/parking.py),
on a stand-in rollout side (no engines): what parking gives back, how a parked worker answers
rollout turns, and that the first weights loaded wake it with them. The real engines' sequence
(park, a turn returned, wake, the run's weights read from inside vLLM) is in
tests/test_borrow_e2e.py."""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch

from executors.coserving import parking
from executors.coserving.config import WIRING
from executors.coserving.executor import CoServingExecutor
from executors.coserving.plugin import CoServingPlugin
from executors.coserving.rollout_turn import new_counters
from executors.turns import TurnRequest


class FakeSide:
    """What parking and a weight load touch of a RolloutSide."""

    def __init__(self, blocks: int = 40, page_ratio: float = 1.5) -> None:
        self.live: dict[str, Future] = {"t0/t0/a0": Future()}
        self.version, self.page_ratio, self.leases_dropped = 0, page_ratio, 0
        self.scheduler = SimpleNamespace(usable_blocks=lambda: blocks, block_bytes=lambda: 1024)
        self.engine, self.aborted = object(), []

    def pages(self, blocks: int) -> int:
        return int(blocks * self.page_ratio)

    def abort(self, rids: list[str], why: str) -> int:
        self.aborted += [(rid, why) for rid in rids]
        for rid in rids:
            self.live.pop(rid)
        return len(rids)

    def drop_all_leases(self) -> None:
        self.leases_dropped += 1


def executor(tmp_path, monkeypatch, mode: str = "rose", park_when_idle: bool = True):
    """A CoServingExecutor whose loop is the calling thread and whose rollout side is a FakeSide;
    rebuilding the engine (wake) makes another FakeSide, a weight load is recorded."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "model.safetensors").write_bytes(b"\0" * 3000)
    ex = CoServingExecutor.__new__(CoServingExecutor)
    ex.cfg = SimpleNamespace(rollout_model_dir=model, park_when_idle=park_when_idle)
    ex.wiring, ex.worker, ex.version, ex._weights = WIRING[mode], "serving-0", 3, None
    ex.parking, ex.rollout, ex.total = parking.new_park_state(), FakeSide(), 50
    ex.rollout_counters, ex.counters = new_counters(), {"rollout_submitted": 0}
    ex._admitting, ex._thread = True, threading.current_thread()
    ex.released, ex.loaded = [], []
    monkeypatch.setattr(parking, "shutdown_rollout", lambda side: ex.released.append(side))
    monkeypatch.setattr(CoServingExecutor, "_rebuild_rollout",
                        lambda self: setattr(self, "rollout", FakeSide()))
    monkeypatch.setattr("executors.engine.vllm_engine.reload_weights",
                        lambda engine, tensors: ex.loaded.append((engine, tensors)))
    return ex


def turn() -> tuple[TurnRequest, Future]:
    return TurnRequest("t1/t0/a0", "t1", [1, 2, 3], 8), Future()


def test_park_gives_the_rollout_engines_memory_back_and_answers_turns_returned(tmp_path, monkeypatch):
    ex = executor(tmp_path, monkeypatch)
    side = ex.rollout
    state = ex.park()
    assert state["parked"] and state["how"] == "destroyed" and state["parks"] == 1
    assert side.aborted == [("t0/t0/a0", "other")] and side.leases_dropped == 1  # rerouted, no lease
    assert ex.released == [side] and ex.rollout is None
    # 40 rollout blocks of 1.5 serving pages: 60, capped at the pool's 50
    assert state["pages_given_back"] == 50 and state["kv_bytes_given_back"] == 40 * 1024
    assert state["weight_bytes_given_back"] == 3000
    assert ex._serving_cap() is None and not ex.admitting()  # serving's cap: the whole pool
    request, fut = turn()
    ex._take([("rollout", request, fut)])
    result = fut.result(0)
    assert result.finished_reason == "returned" and result.response_ids == []  # nothing computed
    assert ex.rollout_counters["returned_unstarted"] == 1
    assert ex.park()["parks"] == 1  # parked already: nothing more to give back


def test_first_weights_loaded_wake_the_engine_with_them(tmp_path, monkeypatch):
    ex = executor(tmp_path, monkeypatch)
    ex.park()
    tensors = {"model.embed_tokens.weight": torch.ones(2, 2)}
    ex.load_rollout_weights(7, tensors)
    state = ex.park_state()
    assert not state["parked"] and state["wakes"] == 1 and state["wake_s"] is not None
    assert ex.rollout is not None and ex.loaded == [(ex.rollout.engine, tensors)]
    assert ex.rollout.version == ex.version == 7
    assert state["pages_given_back"] == 50  # what the last park gave back stays reported
    ex.load_rollout_weights(8, tensors)  # awake: a plain reload
    assert ex.park_state()["wakes"] == 1 and len(ex.loaded) == 2


def test_serving_only_has_nothing_to_park(tmp_path, monkeypatch):
    ex = executor(tmp_path, monkeypatch, mode="serving_only")
    ex.rollout = None
    assert not ex.park()["parked"]
    request, fut = turn()
    ex._take([("rollout", request, fut)])
    assert fut.result(0).finished_reason == "abort"  # as before: no rollout model at all


def test_evict_reload_baseline_does_not_reload_a_parked_engine(tmp_path, monkeypatch):
    ex = executor(tmp_path, monkeypatch, mode="evict_reload")
    ex.park()
    called = []
    monkeypatch.setattr(CoServingExecutor, "_autoscale", lambda self, now: called.append(now))
    ex.serving = SimpleNamespace(used_blocks=lambda: 0)
    ex._usage, ex.policy = deque(), None
    ex.cfg.usage_window_s = 30.0
    ex.timeline = SimpleNamespace(tick=lambda ex, now: None)
    ex._watch_memory(1.0)
    assert called == []


@pytest.mark.parametrize("park_when_idle", [True, False])
def test_plugin_parks_on_detach_where_configured_and_forgets_the_runs_weights(tmp_path, monkeypatch,
                                                                             park_when_idle):
    ex = executor(tmp_path, monkeypatch, park_when_idle=park_when_idle)
    ex.rollout.live.clear()
    plugin = CoServingPlugin(tmp_path, tmp_path, endpoint=False)
    plugin.executor, plugin.run, plugin.weights_digest = ex, "run-a", "abc"
    forgot = []
    plugin.forget_weights = lambda: forgot.append(1)
    plugin.detach()
    assert plugin.run is None
    assert ex.park_state()["parked"] is park_when_idle
    assert forgot == ([1] if park_when_idle else [])  # the next borrower's sync loads in full
    assert plugin.weights_digest == ("" if park_when_idle else "abc")


@pytest.mark.parametrize("start_parked, park_when_idle, parked", [(True, True, True), (True, False, False),
                                                                   (False, True, False)])
def test_a_stack_serving_worker_starts_parked_and_its_first_weights_wake_it(tmp_path, monkeypatch, start_parked,
                                                                           park_when_idle, parked):
    """`rose up`'s plugin (start_parked) parks the rollout engine it built, where park_when_idle
    says so: no run holds the worker yet; a borrower's first weight load wakes it."""
    import executors.coserving.executor as executor_module
    import executors.engine.preload as preload

    ex = executor(tmp_path, monkeypatch, park_when_idle=park_when_idle)
    ex.rollout.live.clear()
    monkeypatch.setattr(preload, "wait_for_engine_import", lambda: None)
    monkeypatch.setattr(executor_module, "CoServingConfig", lambda *a, **k: ex.cfg)
    monkeypatch.setattr(executor_module, "CoServingExecutor", lambda cfg, worker: ex)
    plugin = CoServingPlugin(tmp_path, tmp_path, endpoint=False, start_parked=start_parked)
    plugin.setup(SimpleNamespace(name="serving-0", state=SimpleNamespace(total_resources={"serving_gpu": 1})))
    assert plugin.executor is ex and ex.park_state()["parked"] is parked
    assert (ex.rollout is None) is parked and ex.admitting() is not parked  # no turn comes to a parked one
    if parked:
        assert ex.park_state()["pages_given_back"] == 50  # serving's KV pool whole from the start
        ex.load_rollout_weights(1, {"model.embed_tokens.weight": torch.ones(2, 2)})
        assert not ex.park_state()["parked"] and ex.park_state()["wakes"] == 1 and ex.rollout.version == 1
