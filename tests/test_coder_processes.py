"""Coder processes (storage/weights/coder_processes.py): a delta's pieces coded in processes of
their own, reading both versions from arenas; byte for byte what the threads code, the
receiver bit-exact, and a coder that dies leaves the publisher coding on its threads."""
from __future__ import annotations

import os
import signal

import pytest
import torch

import storage.weights.sparse_publisher as sparse_publisher
from storage.relay.filesystem import FilesystemRelay
from storage.weights.arena_files import sweep_dead
from storage.weights.coder_processes import CoderProcesses, HandedOut, shared_coders
from storage.weights.versions import bucket_key, read_manifest
from storage.weights.receiver import WeightReceiver
from storage.weights.digest import tensors_digest
from storage.weights.sparse_publisher import SparsePublisher
from storage.weights.tensor_arena import TensorArena, arena_of

from weight_fixtures import Training, same


@pytest.fixture(scope="module")
def coders():
    pool = shared_coders(2)
    assert pool.ready(120), pool.failed
    return pool


@pytest.fixture
def coded_here(monkeypatch):
    """Names of the pieces this process codes itself (not handed to a coder)."""
    names: list[str] = []
    real = sparse_publisher.code_piece
    monkeypatch.setattr(sparse_publisher, "code_piece",
                        lambda name, *a: (names.append(name), real(name, *a))[1])
    return names


def _payloads(relay, run: str, version: int) -> dict[tuple[str, tuple | None], bytes]:
    """Each entry's bytes as published, by (tensor, span)."""
    out = {}
    manifest = read_manifest(relay, run, version)
    for bucket, entry in manifest.entries():
        blob = relay.get(bucket_key(run, version, bucket.index))
        span = entry.meta.get("span")
        out[entry.name, None if span is None else tuple(span)] = \
            bytes(blob[entry.offset:entry.offset + entry.length])
    return out


def _small_blocks(monkeypatch) -> None:
    from storage.delta import blocks

    monkeypatch.setattr(blocks, "SPLIT_BYTES", 16 << 10)  # the 38 KB embedding: 5 spans
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 8 << 10)


def test_coders_code_every_delta_piece_as_the_threads_do_bit_exact(tmp_path, coders, coded_here,
                                                                  monkeypatch):
    _small_blocks(monkeypatch)  # spans too: each block a piece of its own
    from_coders: list[tuple[str, float]] = []  # (tensor, seconds its coder took) per piece
    real_get = HandedOut.get

    def get(self, name, span):
        piece = real_get(self, name, span)
        if piece is not None:
            from_coders.append((name, piece.seconds))
        return piece
    monkeypatch.setattr(HandedOut, "get", get)
    relays = {k: FilesystemRelay(tmp_path / k) for k in ("threads", "coders")}
    pubs = {"threads": SparsePublisher(relays["threads"], "r", bucket_bytes=16 << 10),
            "coders": SparsePublisher(relays["coders"], "r", bucket_bytes=16 << 10,
                                      coder_processes=2)}
    rx = WeightReceiver(relays["coders"], "r", full_timeout_s=5)
    train = Training(3)
    for version in range(4):
        weights = train.weights()
        if version >= 2:  # as the trainer takes them for coders: no copy on publish
            weights = TensorArena.of(weights)
            assert arena_of(weights) is not None
        for kind, pub in pubs.items():
            coded_here.clear()
            from_coders.clear()
            report = pub.publish(version, weights, copy=version < 2)
            assert report.digest == tensors_digest(weights)
            assert report.coders == (2 if kind == "coders" and version > 0 else 0)
            if kind == "coders" and version > 0:  # every delta piece went to a coder
                assert report.kind == "delta" and coded_here == [] and from_coders
                # each tensor's encode_s holds its coder's coding time (a span's: summed)
                coded_s = {n: sum(s for m, s in from_coders if m == n) for n, _ in from_coders}
                for stat in report.tensors:
                    if stat.name in coded_s:
                        assert stat.encode_s >= coded_s[stat.name] > 0
        assert _payloads(relays["coders"], "r", version) == \
            _payloads(relays["threads"], "r", version)
        assert rx.pull(version).mode == ("full" if version == 0 else "delta")
        assert same(rx.tensors, weights)
        train.step(3e-2)
    assert any(span for _, span in _payloads(relays["coders"], "r", 3))  # spans were coded
    assert arena_of(pubs["coders"].held) is not None  # the next base, where coders read it


def test_versions_from_elsewhere_are_copied_into_two_arenas_in_turn(tmp_path, coders):
    pub = SparsePublisher(FilesystemRelay(tmp_path / "r"), "r", coder_processes=2)
    train, paths = Training(4), []
    for version in range(4):
        weights = train.weights()
        pub.publish(version, weights)  # copy=True: the caller keeps changing its tensors
        held = arena_of(pub.held)
        assert held is not None and same(pub.held, weights)
        assert all(pub.held[n] is not weights[n] for n in weights)
        paths.append(held[0])
        train.step(3e-2)
    assert paths[0] == paths[2] and paths[1] == paths[3] and paths[0] != paths[1]
    arenas = {f for f in os.listdir(os.path.dirname(paths[0])) if f.startswith(
        f"rose-arena-{os.getpid()}-")}
    assert {os.path.basename(p) for p in paths} <= arenas


def test_a_coder_that_dies_leaves_the_threads_coding(tmp_path, coded_here):
    pool = CoderProcesses(1)  # a pool of its own: this test kills it
    assert pool.ready(120), pool.failed
    relay = FilesystemRelay(tmp_path / "r")
    pub = SparsePublisher(relay, "r")
    pub.coders = pool
    rx = WeightReceiver(relay, "r", full_timeout_s=5)
    train = Training(6)
    for version in range(2):
        pub.publish(version, train.weights())
        rx.pull(version)
        train.step(3e-2)
    os.kill(pool.pids[0], signal.SIGKILL)
    pool._procs[0].wait(10)
    coded_here.clear()
    weights = train.weights()
    report = pub.publish(2, weights)
    assert report.kind == "delta" and report.digest == tensors_digest(weights)
    assert "gone" in (pool.failed or "")
    assert coded_here  # coded here instead
    assert rx.pull(2).mode == "delta" and same(rx.tensors, weights)
    pool.close()


def test_at_least_one_coder(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        CoderProcesses(0)


def test_an_arena_is_held_until_its_last_view_goes_then_reused(tmp_path):
    import gc

    from storage.weights import tensor_arena

    weights = {"a": torch.arange(10, dtype=torch.bfloat16), "b": torch.zeros(0),
               "c": torch.tensor([True, False])}  # bool: no slot, held as a clone
    held = [TensorArena.of(weights) for _ in range(tensor_arena.FREE_PER_LAYOUT + 1)]
    paths = [arena_of(h)[0] for h in held]
    assert all(same(h, weights) for h in held) and len(set(paths)) == len(paths)
    first = held[0]
    assert arena_of({"a": first["a"].clone(), "b": first["b"], "c": first["c"]}) is None
    assert arena_of({"b": first["b"], "a": first["a"]}) is not None  # names, not order
    assert arena_of({"a": first["a"]}) is None  # a slot missing
    view = first["a"]
    del held, first
    gc.collect()
    assert all(os.path.exists(p) for p in paths)  # one is still in use, the others pooled
    del view
    gc.collect()
    alive = [p for p in paths if os.path.exists(p)]
    assert len(alive) == tensor_arena.FREE_PER_LAYOUT  # the pool keeps so many, no more
    again = TensorArena.of({n: t + 1 if n == "a" else t for n, t in weights.items()})
    assert arena_of(again)[0] in alive  # a pooled file, its pages already backed
    assert again["a"].tolist() == (weights["a"] + 1).tolist()


def test_the_trainer_takes_its_snapshot_into_an_arena_bit_for_bit(tmp_path, monkeypatch):
    from executors.workers.trainer import Trainer
    from core.config import ModelsConfig, RunConfig
    from test_tis import _tiny_policy

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path / "data"))
    trainer = Trainer(RunConfig(models=ModelsConfig(policy_dir=_tiny_policy(tmp_path / "p"))))
    plain, shared = trainer.weights_bf16(), trainer.weights_bf16(shared=True)
    assert list(shared) == list(plain) and same(shared, plain)
    assert arena_of(shared) is not None and arena_of(plain) is None


def _publish_in_worker(relay_dir: str) -> dict:
    """In a Dask worker process: start coder processes (its children) and publish a delta."""
    import multiprocessing

    from executors.workers.publishers import trainer_publisher
    from storage.relay import pool as relay_pool

    relay_pool._clients["filesystem", "publisher"] = FilesystemRelay(relay_dir)
    pub = trainer_publisher("filesystem", "w", 1 << 20, serve=False, coder_processes=1)
    ready = pub.coders.ready(120)
    train = Training(8)
    reports = []
    for version in range(3):
        reports.append(pub.publish(version, TensorArena.of(train.weights()), copy=False))
        train.step(3e-2)
    return {"daemon": multiprocessing.current_process().daemon, "ready": ready,
            "failed": pub.coders.failed, "kinds": [r.kind for r in reports],
            "digest": reports[-1].digest}


def test_a_dask_worker_process_runs_coder_processes(tmp_path):
    """Dask's worker processes are daemonic, which multiprocessing refuses children: the
    coders are plain subprocesses, so `rose train`'s trainer worker can start them."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      worker_dashboard_address=None) as cluster, Client(cluster) as client:
        out = client.submit(_publish_in_worker, str(tmp_path / "relay")).result(timeout=300)
    assert out["daemon"] and out["ready"] and out["failed"] is None
    assert out["kinds"] == ["full", "delta", "delta"]
    train = Training(8)  # the same steps here: the worker published what they make
    for _ in range(2):
        train.step(3e-2)
    assert out["digest"] == tensors_digest(train.weights())
    assert read_manifest(FilesystemRelay(tmp_path / "relay"), "w", 2).meta["digest"] == \
        out["digest"]


def test_coder_processes_is_checked():
    from pydantic import ValidationError

    from core.config import RunConfig

    with pytest.raises(ValidationError, match="coder_processes"):
        RunConfig(publish={"coder_processes": -1})


def test_arena_files_of_processes_that_are_gone_are_swept(tmp_path):
    import subprocess
    import sys

    from storage.weights import tensor_arena

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    left = tmp_path / f"rose-arena-{dead}-0123456789ab"  # a killed trainer's
    alive = tmp_path / f"rose-arena-{os.getppid()}-0123456789ab"  # a live process's
    other = tmp_path / "unrelated"
    for f in (left, alive, other):
        f.write_bytes(b"x")
    TensorArena({"a": torch.zeros(4)}, directory=str(tmp_path))
    assert not left.exists() and alive.exists() and other.exists()
    assert str(tmp_path) in tensor_arena._swept
    left.write_bytes(b"x")  # `rose down` sweeps too, after stopping the workers
    assert sweep_dead(str(tmp_path)) == 1 and not left.exists() and alive.exists()


def test_the_trainer_publisher_starts_coders_again_once_they_failed(tmp_path, monkeypatch):
    from executors.workers import publishers
    from storage.relay import pool as relay_pool

    monkeypatch.setitem(relay_pool._clients, ("filesystem", "publisher"),
                        FilesystemRelay(tmp_path / "relay"))
    monkeypatch.setattr(publishers, "_publishers", {})
    pub = publishers.trainer_publisher("filesystem", "again", 1 << 20, serve=False,
                                       coder_processes=3)
    first = pub.coders
    assert first.ready(120)
    os.kill(first.pids[0], signal.SIGKILL)
    first._procs[0].wait(10)
    train = Training(9)
    for version in range(3):  # the delta finds the coder gone, and is coded on threads
        pub.publish(version, TensorArena.of(train.weights()), copy=False)
        train.step(3e-2)
    assert first.failed
    again = publishers.trainer_publisher("filesystem", "again", 1 << 20, serve=False,
                                         coder_processes=3)
    assert again is pub and pub.coders is not first and pub.coders.ready(120)
    assert all(p.poll() is not None for p in first._procs)  # the old ones are gone


def test_a_queue_longer_than_the_pipe_is_written_beside_the_answers(tmp_path, coders, coded_here,
                                                                    monkeypatch):
    """Past what the pipe holds, the piece numbers are written on a thread of their own, while
    the publisher reads answers (else a coder blocked sending a payload would stop taking
    numbers, and the publisher blocked writing them would never read it)."""
    from storage.weights import coder_processes

    monkeypatch.setattr(coder_processes, "PIPE_NUMBERS", 1)
    _small_blocks(monkeypatch)
    relay = FilesystemRelay(tmp_path / "r")
    pub = SparsePublisher(relay, "r", bucket_bytes=16 << 10, coder_processes=2)
    rx = WeightReceiver(relay, "r", full_timeout_s=5)
    train = Training(11)
    for version in range(3):
        coded_here.clear()
        weights = TensorArena.of(train.weights())
        pub.publish(version, weights, copy=False)
        assert rx.pull(version).mode == ("full" if version == 0 else "delta")
        assert same(rx.tensors, weights)
        train.step(3e-2)
    assert coded_here == [] and pub.coders.failed is None
