"""Sharded publishing in the live path: the publish task (tasks/publish.publish_and_sync) on a
Dask trainer worker publishes by the trainer's declared layout (publish.shard_split) and the
rollout workers' engines (stand-ins) pull the parts and run the model bit for bit; a stale
worker resynced by the rollout task takes its parts in full from the trainer's part servers;
the default config still publishes one unsharded version."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from distributed import Client, Scheduler, SpecCluster, Worker

import tasks.publish
from executors.workers import publishers
from executors.workers.publishers import publish_sharded
from storage.weights.digest import tensors_digest
from core.config import RunConfig
from storage.relay import pool as relay_pool
from storage.relay.filesystem import FilesystemRelay
from storage.weights.versions import read_manifest
from storage.weights.transfer_metrics import transfer_path
from tasks.publish import publish_and_sync
from tasks.rollout import resync_from_relay

from test_sharded_publish import DIMS, _step, _tiny
from test_weight_sync_dask import GATE, FakeRolloutPlugin, engines

WORKERS = {"trainer-0": {"train_gpu": 1}, "rollout-0": {"rollout_gpu": 1}, "rollout-1": {"rollout_gpu": 1}}


@pytest.fixture
def live(tmp_path, monkeypatch):
    """A trainer worker and two rollout workers (stand-in engines) on one filesystem relay,
    the tiny policy's config on disk, and a stand-in trainer whose version the test sets."""
    from transformers import Qwen3Config

    Qwen3Config(**DIMS).save_pretrained(tmp_path / "policy")
    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path / "data"))
    relay = FilesystemRelay(tmp_path / "relay")
    for role in ("publisher", "reader"):
        monkeypatch.setitem(relay_pool._clients, ("filesystem", role), relay)
    _, full = _tiny()
    versions = [full]
    for _ in range(3):
        versions.append({n: _step(t) for n, t in versions[-1].items()})
    trainer = SimpleNamespace(version=0)
    trainer.weights_bf16 = lambda shared=False: versions[trainer.version]
    monkeypatch.setattr(tasks.publish, "local_trainer", lambda run: trainer)
    GATE.set()  # the stand-in engines reload at once
    spec = {n: {"cls": Worker, "options": {"name": n, "nthreads": 2, "dashboard": False, "resources": r}}
            for n, r in WORKERS.items()}
    with SpecCluster(workers=spec, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                     asynchronous=False) as c, Client(c) as client:
        client.register_plugin(FakeRolloutPlugin(), name="rose-rollout")
        monkeypatch.setattr(publishers, "_sharded", {})  # this test's trainer publishers alone
        try:
            yield SimpleNamespace(client=client, relay=relay, trainer=trainer, versions=versions,
                                  policy=tmp_path / "policy")
        finally:  # their part servers' threads stop with the test
            for _, pub in publishers._sharded.values():
                pub.stop_servers()


def _cfg(live, run: str, **publish) -> RunConfig:
    return RunConfig(run_id=run, stack={"relay": "filesystem"}, models={"policy_dir": str(live.policy)},
                     publish=publish)


def _publish(live, cfg: RunConfig, version: int) -> dict:
    live.trainer.version = version
    return live.client.submit(publish_and_sync, cfg, version, "all", workers=["trainer-0"],
                              pure=False).result(timeout=120)


def test_publish_task_sharded_reaches_every_engine_bit_exact(live) -> None:
    cfg = _cfg(live, "live", shard_split=2)
    for v in range(3):
        summary = _publish(live, cfg, v)
        manifest = read_manifest(live.relay, "live", v)
        assert manifest.meta["kind"] == "sharded" and manifest.meta["layout"]["split"] == 2
        assert sorted(manifest.meta["parts"]) == [f"shards/r0.0.0/{g}" for g in ("all", "g0", "g1")]
        assert summary["kind"] == ("full" if v == 0 else "delta")
        assert summary["pull_modes"] == {"rollout-0": summary["kind"], "rollout-1": summary["kind"]}
        # TP=1 engines pull every part: the version's every byte, no more
        assert summary["pulled_bytes"] == summary["bytes"] == sum(p["bytes"] for p in manifest.meta["parts"].values())
        assert transfer_path(cfg.run_dir(), v).exists()
        # the tiny policy's parts are too small to measure the link: the configured 10 Gbps
        assert summary["link_measured"] == {"put_gbps": None, "get_gbps": None}
        assert summary["link_gbps"] == (None if v == 0 else 10.0)
        assert all(w["get_bytes"] > 0 for w in summary["workers"])
        state = engines(live.client)
        assert {s["version"] for s in state.values()} == {v}
        assert {s["digest"] for s in state.values()} == {tensors_digest(live.versions[v])}


def test_stale_worker_resynced_by_the_rollout_task_takes_full_parts(live) -> None:
    cfg = _cfg(live, "stale", shard_split=2)
    _publish(live, cfg, 0)
    for v in (1, 2):  # pushed and committed, no engine told: both miss them
        live.client.submit(publish_sharded, cfg, v, live.versions[v], workers=["trainer-0"],
                           pure=False).result(timeout=60)
    record = resync_from_relay(live.client, cfg, 2)("rollout-1", "rollout").result(timeout=120)
    assert record["version"] == 2 and record["mode"] == "full" and "delta onto v1" in record["fallback"]
    assert all(p.endswith("/full") for p in record["parts"])  # served by the trainer's part servers
    state = engines(live.client)
    assert state["rollout-1"]["digest"] == tensors_digest(live.versions[2])
    assert state["rollout-0"]["version"] == 0  # not resynced: still on v0


def test_default_config_publishes_one_unsharded_version(live) -> None:
    cfg = _cfg(live, "plain")
    assert cfg.publish.shard_split is None
    for v in range(2):
        summary = _publish(live, cfg, v)
        assert read_manifest(live.relay, "plain", v).meta["kind"] == summary["kind"] == ("full", "delta")[v]
        assert not live.relay.exists(f"rose/plain/v{v}/shards/r0.0.0/all/manifest")
    assert {s["digest"] for s in engines(live.client).values()} == {tensors_digest(live.versions[1])}


def test_shard_split_is_validated() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        RunConfig(publish={"shard_split": 0})
