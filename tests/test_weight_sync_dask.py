"""Weight sync on Dask workers: background pulls into (stand-in) engines, waiting for versions,
staleness floors, and the transfer metrics file."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import duckdb
import pytest
import torch
from distributed import Client, Scheduler, SpecCluster, Worker, WorkerPlugin

from executors.workers.weight_sync import sync_weights as rollout_sync_weights
from storage.weights.digest import tensors_digest
from executors.workers.weight_sync import (policy_floor, pull_status, start_pulls, wait_versions)
from storage.relay import pool as relay_pool
from storage.relay.filesystem import FilesystemRelay
from storage.weights.sparse_publisher import SparsePublisher
from storage.weights.transfer_metrics import transfer_path, write_transfer_metrics

GATE = threading.Event()  # a closed gate holds the stand-in engine's reload (a slow pull)


class FakeEngine:
    """Just what reload_weights / read_weight touch of a vLLM engine."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.reloads = 0

    def collective_rpc(self, method, kwargs=None):
        if method == "reload_weights":
            GATE.wait(30)
            self.weights = {n: t.clone() for n, t in kwargs["weights_iterator"]}
            self.reloads += 1
            return [None]
        model = SimpleNamespace(named_parameters=lambda: self.weights.items(),
                                modules=lambda: [])  # no packed LM head to re-pack
        return [method(SimpleNamespace(model_runner=SimpleNamespace(model=model)))]

    def reset_prefix_cache(self) -> bool:
        return True


class FakeLoop:
    def __init__(self) -> None:
        self.engine, self.policy_version = FakeEngine(), 0

    def call(self, fn):
        return fn(self.engine)

    def reload(self, tensors, version, run: str = "") -> int:  # EngineLoop.reload, no turn in flight
        from executors.engine.vllm_engine import reload_weights

        reload_weights(self.engine, tensors)
        self.policy_version, self.run = version, run
        return 0


class FakeRolloutPlugin(WorkerPlugin):
    idempotent = True
    name = "rose-rollout"

    def setup(self, worker) -> None:
        self.loop = FakeLoop() if worker.name.startswith("rollout") else None
        self.run, self.weights_digest = None, ""


def engine_state(dask_worker) -> dict:
    plugin = dask_worker.plugins["rose-rollout"]
    return {"version": plugin.loop.policy_version, "digest": tensors_digest(plugin.loop.engine.weights),
            "reloads": plugin.loop.engine.reloads}


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    relay = FilesystemRelay(tmp_path / "relay")
    monkeypatch.setitem(relay_pool._clients, ("filesystem", "reader"), relay)
    names = ["rollout-0", "rollout-1", "trainer-0"]
    spec = {n: {"cls": Worker, "options": {"name": n, "nthreads": 2, "dashboard": False}}
            for n in names}
    with fake_stack(spec) as client:
        yield client, relay


@contextmanager
def fake_stack(spec: dict) -> Iterator[Client]:
    """An in-process Dask cluster of `spec`'s workers, rollout-* with stand-in engines."""
    GATE.set()
    with SpecCluster(workers=spec, scheduler={"cls": Scheduler,
                                              "options": {"dashboard_address": None}},
                     asynchronous=False) as c, Client(c) as client:
        client.register_plugin(FakeRolloutPlugin(), name="rose-rollout")
        yield client
    GATE.set()


def weights(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = {"model.embed_tokens.weight": 0.02 * torch.randn(96, 32, generator=g),
            "model.layers.0.mlp.up_proj.weight": 0.02 * torch.randn(64, 32, generator=g)}
    return {n: (t + 1e-3 * step * torch.randn(t.shape, generator=g)).to(torch.bfloat16)
            for n, t in base.items()}


def engines(client, wait_s: float = 10.0) -> dict[str, dict]:
    """Rollout worker name -> its stand-in engine's version, digest and reload count. Waits up
    to `wait_s` for the scheduler to list a rollout worker (once, in a full-suite run on 2
    busy cores, it listed none for a moment: the test then failed on a KeyError, not on what
    it checks)."""
    deadline = time.monotonic() + wait_s
    while True:
        names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()
                 if w["name"].startswith("rollout")}
        if names or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {names[a]: s for a, s in client.run(engine_state, workers=list(names)).items()}


def test_policy_floor():
    assert policy_floor(5, 1, "rollout") == 4  # step 5 rolls out with v4, exactly
    assert policy_floor(5, 1, "serving") == 3  # a borrowed worker may lag one version
    assert policy_floor(5, 2, "serving") == 2
    assert policy_floor(1, 3, "serving") == 0  # never below the first version
    with pytest.raises(ValueError):
        policy_floor(0, 1, "rollout")


def test_background_pulls_reach_every_engine_bit_exact(cluster):
    client, relay = cluster
    pub = SparsePublisher(relay, "r")
    rollout = ["rollout-0", "rollout-1"]
    for v in range(3):
        pub.publish(v, weights(v))
        started = start_pulls(client, rollout + ["trainer-0"], "filesystem", "r", v)
        assert "no rollout engine" in started["trainer-0"]["skipped"]
        done = wait_versions(client, rollout, "r", v, timeout=60)
        assert {r["version"] for r in done.values()} == {v}
        assert {r["mode"] for r in done.values()} == {"full" if v == 0 else "delta"}
        state = engines(client)
        for name in rollout:
            assert state[name]["version"] == v
            assert state[name]["digest"] == tensors_digest(weights(v)) == done[name]["digest"]
    # the synchronous path (what the rollout scheduler's resync uses) is a no-op now
    again = client.submit(rollout_sync_weights, "filesystem", "r", 2, workers=["rollout-0"],
                          pure=False).result()
    assert again["mode"] == "noop" and engines(client)["rollout-0"]["reloads"] == 3


def test_engine_keeps_old_version_until_its_pull_completes(cluster):
    """A borrowed worker keeps serving v0 while v1 is pulled; it switches only when loaded."""
    client, relay = cluster
    pub = SparsePublisher(relay, "r")
    pub.publish(0, weights(0))
    start_pulls(client, ["rollout-0"], "filesystem", "r", 0)
    wait_versions(client, ["rollout-0"], "r", 0, timeout=60)
    GATE.clear()  # the next reload blocks
    pub.publish(1, weights(1))
    status = start_pulls(client, ["rollout-0"], "filesystem", "r", 1)["rollout-0"]
    assert status["loaded"] == 0 and status["pulling"]  # returned at once, still pulling
    assert engines(client)["rollout-0"]["version"] == 0
    with pytest.raises(TimeoutError, match="not loaded within"):
        wait_versions(client, ["rollout-0"], "r", 1, timeout=0.3)
    GATE.set()
    assert wait_versions(client, ["rollout-0"], "r", 1, timeout=60)["rollout-0"]["mode"] == "delta"
    assert engines(client)["rollout-0"]["version"] == 1
    state = client.submit(pull_status, "r", workers=["rollout-0"], pure=False).result()
    assert state["loaded"] == 1 and not state["pulling"] and not state["error"]


def test_worker_left_behind_resyncs_in_full(cluster):
    client, relay = cluster
    pub = SparsePublisher(relay, "r")
    pub.start_server(interval_s=0.02)
    try:
        both = ["rollout-0", "rollout-1"]
        pub.publish(0, weights(0))
        start_pulls(client, both, "filesystem", "r", 0)
        wait_versions(client, both, "r", 0, timeout=60)
        for v in (1, 2):  # rollout-1 misses both
            pub.publish(v, weights(v))
            start_pulls(client, ["rollout-0"], "filesystem", "r", v)
            wait_versions(client, ["rollout-0"], "r", v, timeout=60)
        start_pulls(client, both, "filesystem", "r", 2)
        done = wait_versions(client, both, "r", 2, timeout=60)
        assert done["rollout-1"]["mode"] == "full" and "v0 held" in done["rollout-1"]["fallback"]
        assert done["rollout-0"]["mode"] == "noop"
        assert {s["digest"] for s in engines(client).values() if s["reloads"]} == {
            tensors_digest(weights(2))}
    finally:
        pub.stop_server()


def test_a_failed_pull_is_reported_not_hung(cluster, monkeypatch):
    import executors.workers.weight_sync as ws

    monkeypatch.setattr(ws, "FULL_TIMEOUT_S", 0.5)
    client, relay = cluster
    start_pulls(client, ["rollout-0"], "filesystem", "nothing-published", 0)
    with pytest.raises(RuntimeError, match="pull of v0 failed: SnapshotUnavailable"):
        wait_versions(client, ["rollout-0"], "nothing-published", 0, timeout=60)


def test_transfer_metrics_parquet(tmp_path):
    relay = FilesystemRelay(tmp_path / "relay")
    pub = SparsePublisher(relay, "r")
    pub.publish(0, weights(0))
    report = pub.publish(1, weights(1))
    summary = {**report.summary(), "pull_s": 0.5, "workers_synced": 2}
    path = write_transfer_metrics(tmp_path / "run", 1, summary, report.rows())
    assert path == transfer_path(tmp_path / "run", 1)
    assert write_transfer_metrics(tmp_path / "run", 1, summary, report.rows()) is None
    rows = duckdb.sql(f"SELECT name, layer, kind, changed, numel, pull_s_max FROM "
                      f"read_parquet('{path}') ORDER BY name").fetchall()
    w0, w1 = weights(0), weights(1)
    assert [r[0] for r in rows] == sorted(w1)
    for name, layer, kind, changed, numel, pull_s in rows:
        a, b = w0[name].view(torch.int16), w1[name].view(torch.int16)
        assert changed == int((a != b).sum()) and numel == a.numel()
        assert kind == "delta" and pull_s == 0.5
        assert layer == (0 if "layers.0" in name else -1)
