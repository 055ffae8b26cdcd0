"""The publish task leaves the trainer worker's one task thread before it pushes (issue 15
item 2): the next update starts while the version is still being encoded and put, and the
version becomes visible, and reaches the engines, only once complete."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from distributed import Worker

import tasks.publish
from core.config import RunConfig
from storage.relay import pool as relay_pool
from storage.relay.filesystem import FilesystemRelay
from storage.weights.versions import latest_version
from tasks.publish import publish_and_sync

from test_weight_sync_dask import engines, fake_stack

PUT_S = 0.15  # each bucket put: the push takes about a second


class SlowPuts:
    """The trainer's relay: bucket puts take PUT_S; records when the first bucket and the
    manifest of a version went out."""

    def __init__(self, inner: FilesystemRelay) -> None:
        self.inner, self.first_bucket, self.manifest_at = inner, threading.Event(), None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put(self, key, data):
        if "/bucket-" in key:
            self.first_bucket.set()
            time.sleep(PUT_S)
        elif key.endswith("/manifest"):
            self.manifest_at = time.perf_counter()
        self.inner.put(key, data)


@pytest.fixture
def stack(tmp_path, monkeypatch):
    relay = FilesystemRelay(tmp_path / "relay")
    writer = SlowPuts(relay)
    monkeypatch.setitem(relay_pool._clients, ("filesystem", "publisher"), writer)
    monkeypatch.setitem(relay_pool._clients, ("filesystem", "reader"), relay)
    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path / "data"))
    spec = {name: {"cls": Worker, "options": {"name": name, "nthreads": threads,
                                                "resources": {resource: 1},
                                                "dashboard": False}}
            for name, threads, resource in [("trainer-0", 1, "train_gpu"),
                                            ("rollout-0", 2, "rollout_gpu")]}
    with fake_stack(spec) as client:
        yield client, writer


def update() -> float:
    """Stands in for the next train step: when it got the trainer's task thread."""
    return time.perf_counter()


def test_next_update_starts_while_the_version_is_pushed(stack):
    client, writer = stack
    cfg = RunConfig(run_id="bg-publish", max_staleness=1, stack={"relay": "filesystem"},
                    publish={"bucket_bytes": 1 << 20})
    g = torch.Generator().manual_seed(0)
    weights = {f"model.layers.{i}.mlp.up_proj.weight":
               torch.randn(1024, 1024, generator=g).to(torch.bfloat16) for i in range(5)}
    with tasks.publish._snapshot_lock:  # what the train task keeps (keep_snapshot)
        tasks.publish._snapshots["bg-publish", 1] = weights
    try:
        on_trainer = {"workers": ["trainer-0"], "allow_other_workers": False, "pure": False}
        published = client.submit(publish_and_sync, cfg, 1, "dedicated", **on_trainer)
        assert writer.first_bucket.wait(30)
        assert latest_version(writer.inner, "bg-publish") is None  # not visible mid-push
        started = client.submit(update, **on_trainer).result(timeout=30)
        summary = published.result(timeout=60)
    finally:
        with tasks.publish._snapshot_lock:
            tasks.publish._snapshots.pop(("bg-publish", 1), None)
    assert summary["buckets"] >= 5 and summary["pushed_s"] >= 5 * PUT_S
    # the update had the thread before the manifest (the last of the push) went out
    assert started < writer.manifest_at
    assert latest_version(writer.inner, "bg-publish") == 1
    assert engines(client)["rollout-0"]["version"] == 1
    assert engines(client)["rollout-0"]["digest"] == summary["digest"]


def test_engines_apply_a_coded_delta_while_it_is_pushed(stack):
    """publish.stream: the engines' pulls start before the push, so buckets of a coded delta
    are applied before its manifest goes out; the engine then runs it bit for bit."""
    client, writer = stack
    cfg = RunConfig(run_id="stream-publish", stack={"relay": "filesystem"},
                    publish={"bucket_bytes": 1 << 20, "link_gbps": 0.05})  # slow: code it all
    g = torch.Generator().manual_seed(1)
    v1 = {f"model.layers.{i}.mlp.up_proj.weight":
          torch.randn(1024, 1024, generator=g).to(torch.bfloat16) for i in range(5)}
    v2 = {n: t.clone() for n, t in v1.items()}
    for t in v2.values():  # a sparse update: one element in a hundred moves
        hit = torch.rand(t.shape, generator=g) < 0.01
        t[hit] = (t[hit].float() * 1.01).to(torch.bfloat16)
    on_trainer = {"workers": ["trainer-0"], "allow_other_workers": False, "pure": False}
    v3 = {n: (t.float() * 1.01).to(torch.bfloat16) for n, t in v2.items()}  # all moved
    fast = cfg.model_copy(update={"publish": cfg.publish.model_copy(update={"link_gbps": 400})})
    summaries = []
    try:
        for version, weights, c in ((1, v1, cfg), (2, v2, cfg), (3, v3, fast)):
            with tasks.publish._snapshot_lock:
                tasks.publish._snapshots["stream-publish", version] = weights
            summaries.append(client.submit(publish_and_sync, c, version, "dedicated",
                                           **on_trainer).result(timeout=120))
    finally:
        with tasks.publish._snapshot_lock:
            for v in (1, 2, 3):
                tasks.publish._snapshots.pop(("stream-publish", v), None)
    full, delta, raw = summaries
    # a full snapshot is not streamed: the pulls start once it is complete
    assert not full["streamed"] and full["streamed_buckets"] == 0
    assert delta["streamed"] and delta["kind"] == "delta" and delta["buckets"] >= 3
    assert delta["streamed_buckets"] >= 1 and delta["full_fallbacks"] == 0
    # every element moved, a fast link: all raw, nothing to overlap, pulled once complete
    assert raw["kind"] == "delta" and set(raw["encodings"]) == {"raw"}
    assert not raw["streamed"] and raw["streamed_buckets"] == 0 and raw["full_fallbacks"] == 0
    assert engines(client)["rollout-0"]["version"] == 3
    assert engines(client)["rollout-0"]["digest"] == raw["digest"]
    # 5 MB versions: too small to measure the link (16 MB and up), the configured rates rule
    assert (delta["link_gbps"], raw["link_gbps"]) == (0.05, 400)
    assert raw["link_measured"] == {"put_gbps": None, "get_gbps": None}


def test_the_next_publish_chooses_by_the_link_its_transfers_measured(stack, monkeypatch):
    """publish.measure_link (on by default): the full snapshot's bucket puts (PUT_S each, ~0.05
    Gbps) and the engine's gets measure the link; configured at 400 Gbps, where a delta this
    sparse would go all raw, the next one is chosen for the slow put leg instead, coded."""
    import storage.weights.link_rate

    monkeypatch.setattr(storage.weights.link_rate, "MIN_BYTES", 1 << 20)  # 5 MB versions
    client, writer = stack
    cfg = RunConfig(run_id="measure-link", stack={"relay": "filesystem"},
                    publish={"bucket_bytes": 1 << 20, "link_gbps": 400})
    g = torch.Generator().manual_seed(2)
    v1 = {f"model.layers.{i}.mlp.up_proj.weight":
          torch.randn(1024, 512, generator=g).to(torch.bfloat16) for i in range(5)}
    v2 = {n: t.clone() for n, t in v1.items()}
    for t in v2.values():
        hit = torch.rand(t.shape, generator=g) < 0.3
        t[hit] = (t[hit].float() * 1.01).to(torch.bfloat16)
    on_trainer = {"workers": ["trainer-0"], "allow_other_workers": False, "pure": False}
    summaries = []
    try:
        for version, weights in ((1, v1), (2, v2)):
            with tasks.publish._snapshot_lock:
                tasks.publish._snapshots["measure-link", version] = weights
            summaries.append(client.submit(publish_and_sync, cfg, version, "dedicated",
                                           **on_trainer).result(timeout=120))
    finally:
        with tasks.publish._snapshot_lock:
            for v in (1, 2):
                tasks.publish._snapshots.pop(("measure-link", v), None)
    full, delta = summaries
    measured = full["link_measured"]
    assert measured["put_gbps"] <= 1.05 * (1 << 20) * 8 / PUT_S / 1e9  # held by PUT_S a bucket
    assert measured["get_gbps"] > measured["put_gbps"]  # the engine's gets: no slow link there
    assert full["workers"][0]["get_bytes"] >= 5 << 20
    assert delta["link_gbps"] == pytest.approx(measured["put_gbps"])
    assert delta["kind"] == "delta" and set(delta["encodings"]) != {"raw"}
    assert engines(client)["rollout-0"]["digest"] == delta["digest"]
