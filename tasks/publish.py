"""Publish phase: the trainer pushes the new policy through the relay, the engines pull it.

The push is sparse (storage/weights/sparse_publisher.py): a lossless bf16 delta against the version
published before, or a full snapshot when there is none; in a delta each tensor is coded or sent
raw, whichever storage/delta/time_model.py predicts reaches the engines sooner over
`publish.link_gbps` (on the demo's tiny policy at the default 10 Gbps: all raw). Every dedicated
rollout worker and every serving worker the run holds (tasks/borrow.py) pulls in the background
(executors/workers/weight_sync.py), started just before the push when it is a coded delta
(`publish.stream`: applied bucket by bucket as it lands, while the trainer still encodes the rest;
storage/weights/stream_pull.py), else once it is complete (a full snapshot, a delta all sent raw:
nothing to overlap), and reloads in place when its pull completes: a delta onto the weights it
holds, or a full snapshot when it cannot (skew, damage, a lost relay). With `publish.shard_split`
the version is published by the trainer's declared layout instead
(executors/workers/publishers.publish_sharded: parts, then one commit) and engines pull the parts
their layout needs; the same waits, checks and metrics follow.

When the task returns (`wait_for`):
  "dedicated" (default) the push is done and the dedicated rollout workers run the version (the
              next step's rollout needs it on them); borrowed serving workers are still
              pulling, and may serve the older version until they switch (max_staleness)
  "none"      right after the push; the caller waits before rollout (weight_sync.wait_versions)
  "all"       every engine runs the version
Every worker that was waited for is checked bit for bit (digest of its weights == trainer's).
The result holds the step's transfer metrics, also written to <run>/transfer/step=<n>.parquet.
"""
from __future__ import annotations

import logging
import threading
import time

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from executors.workers.publishers import (
    observe_pulls,
    policy_full_specs,
    publish_sharded,
    sharded_publisher,
    trainer_layout,
    trainer_publisher,
)
from executors.workers.trainer import local_trainer
from executors.workers.weight_sync import start_pulls, wait_versions
from core.config import RunConfig
from storage.weights.transfer_metrics import worker_reasons, write_transfer_metrics
from storage.relay.pool import shared_relay
from storage.shards.plan import assemble
from storage.weights.sharded_versions import commit_sharded
from storage.weights.digest import tensors_digest
from storage.weights.transfer_metrics import PublishReport
from tasks.borrow import stack_leases
from tasks.placement import require, workers_by_kind
from tasks.trainer_group import on_ranks
from tasks.worker_threads import client_outside_thread_pool

WAIT_FOR = ("dedicated", "none", "all")
log = logging.getLogger(__name__)
_snapshots: dict[tuple[str, int], dict[str, torch.Tensor]] = {}  # (run, version) -> bf16 weights
_snapshot_lock = threading.Lock()


# Never cached: publishing is idempotent and must leave every rollout worker on `version`.
@task(name="publish", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def publish(cfg: RunConfig, version: int, until: str = "dedicated") -> dict:
    # `until` is publish_and_sync's `wait_for`: Prefect reserves that name for task arguments.
    return publish_and_sync(cfg, version, until)


def publish_and_sync(cfg: RunConfig, version: int, wait_for: str = "dedicated",
                     timeout_s: float = 600.0) -> dict:
    """Push `version` from this (trainer) worker, start every engine's pull, wait per
    `wait_for`; returns the step's transfer metrics (see the module docstring)."""
    if wait_for not in WAIT_FOR:
        raise ValueError(f"wait_for must be one of {WAIT_FOR}, got {wait_for!r}")
    group = cfg.train.backend == "megatron"  # its ranks push their own shards (publish_group)
    weights = None if group else weights_of(cfg.run_id, version, _shared(cfg))
    # Out of the trainer worker's task thread (the client secedes) before the push: with
    # one thread there, the next update (max_staleness 1) starts beside encoding and puts
    # instead of queueing behind them. The version still becomes visible only once complete.
    with client_outside_thread_pool() as client:
        sharded = cfg.publishes_sharded
        kinds = workers_by_kind(client)
        dedicated = require(kinds, "rollout")
        # only the serving workers this run holds (tasks/borrow.py): another run's must keep
        # that run's weights; one lent to this run later loads the version then
        serving = [n for n in stack_leases().held_by(cfg.run_id) if kinds.get(n) == "serving"]
        # a worker that is gone, restarting or silent is not waited for (never a hang): it
        # pulls this version before the rollout scheduler routes turns to it again
        left: dict[str, str] = {}

        def start(await_s: float) -> dict[str, dict]:
            return start_pulls(client, dedicated + serving, cfg.stack.relay, cfg.run_id, version,
                               cfg.publish.pull_batch_bytes, left_out=left, sharded=sharded,
                               await_s=await_s)
        t0 = time.perf_counter()
        publisher = None if sharded else trainer_publisher(
            cfg.stack.relay, cfg.run_id, cfg.publish.bucket_bytes, cfg.publish.sparse,
            link_gbps=cfg.publish.link_gbps, stream=cfg.publish.stream,
            measure_link=cfg.publish.measure_link, measure_cpu=cfg.publish.measure_cpu,
            coder_processes=cfg.publish.coder_processes)
        # streamed (a coded delta): the engines wait for the push and apply it as it lands;
        # otherwise they pull once it is complete (a full snapshot, a delta all sent raw)
        streamed = publisher is not None and publisher.streams(version, weights)
        started = start(timeout_s) if streamed else None
        t_push = time.perf_counter()
        if group:
            report = publish_group(client, cfg, version)
        elif publisher is None:
            report = publish_sharded(cfg, version, weights)
        else:
            report = publisher.publish(version, weights, copy=False)  # fresh tensors
        digest = report.digest  # = storage.weights.digest.tensors_digest of the bf16 weights
        pushed_s = time.perf_counter() - t_push
        if started is None:
            started = start(0.0)
        skipped = {n: s["skipped"] for n, s in started.items() if "skipped" in s}
        engines = [n for n in started if n not in skipped]
        waited = {"dedicated": [n for n in dedicated if n in engines], "none": [],
                  "all": engines}[wait_for]
        pulled = wait_versions(client, waited, cfg.run_id, version, timeout_s, left_out=left)
    measured = observe_pulls(cfg, pulled.values())  # the link's get leg, for the next publish
    if left or skipped:  # the step goes on without them: say which and why, in the log
        log.warning("publish v%d of %s did not wait for %s", version, cfg.run_id,
                    worker_reasons({**left, **skipped}))
    wrong = sorted(w for w, p in pulled.items()
                   if p.get("version") == version and p.get("digest") != digest)
    if wrong:
        raise RuntimeError(f"workers {wrong} hold weights that differ from version {version}")
    summary = {**report.summary(), **_pull_summary(pulled), "digest": digest,
               "bytes": report.pushed_bytes, "pushed_s": pushed_s,
               "synced_s": time.perf_counter() - t0, "wait_for": wait_for,
               "streamed": streamed,  # the pulls started before the push, to stream it
               "pending": sorted(set(engines) - set(waited)), "left_out": left,
               "skipped": skipped,  # worker -> why (no engine, its pull could not start)
               "link_measured": measured,  # both legs so far (storage/weights/link_rate.py)
               "workers": list(pulled.values())}
    write_transfer_metrics(cfg.run_dir(), version, summary, report.rows())
    return summary


def publish_group(client, cfg: RunConfig, version: int) -> PublishReport:
    """Every rank of a megatron trainer group pushes its own slices of `version` (parts of the
    layout's ranks, storage/shards/grain.py), then one commit makes it visible. The digest the
    engines are checked against is the whole model's, assembled here from the ranks' slices."""
    t0 = time.perf_counter()
    specs, layout = policy_full_specs(cfg), trainer_layout(cfg)
    pushed = on_ranks(client, cfg, publish_rank, version, specs)
    commit_sharded(shared_relay(cfg.stack.relay), cfg.run_id, version, layout, specs)
    full = {}
    for p in specs:  # bf16 travels through Dask as its int16 bits
        held = {rank[0]: w[p.name].view(torch.bfloat16) for _, w, rank in pushed if p.name in w and rank[2] == 0}
        full[p.name] = assemble([held[t] for t in range(layout.trainer.tp)], p.rule, p.shape)
    reports = [r for parts, _, _ in pushed for _, r in sorted(parts.items())]
    report = PublishReport.combine(version, reports, tensors_digest(full), time.perf_counter() - t0)
    report.rank_bytes = {"r{}.{}.{}".format(*rank): sum(r.pushed_bytes for r in parts.values())
                         for parts, _, rank in pushed}
    return report


def publish_rank(cfg: RunConfig, version: int, specs: list) -> tuple[dict, dict, tuple]:
    """On one rank: push its parts of `version`; (part -> report, its bf16 slices, its rank)."""
    trainer = local_trainer(cfg.run_id)
    weights = weights_of(cfg.run_id, version)
    pub = sharded_publisher(cfg, specs, rank=trainer.layout_rank)
    parts = pub.publish(version, weights)
    bits = {n: t.view(torch.int16) for n, t in weights.items()} if trainer.layout_rank[2] == 0 else {}
    return parts, bits, trainer.layout_rank


def keep_snapshot(cfg: RunConfig, trainer) -> None:
    """Right after an update: keep its bf16 weights for publish, so the next update may start
    before this version is pushed (max_staleness = 1). Versions v-max_staleness..v are held."""
    v, keep = trainer.version, range(trainer.version - cfg.max_staleness, trainer.version + 1)
    with _snapshot_lock:
        for key in [k for k in _snapshots if k[0] == cfg.run_id and k[1] not in keep]:
            del _snapshots[key]
        _snapshots[cfg.run_id, v] = trainer.weights_bf16(shared=_shared(cfg))


def _shared(cfg: RunConfig) -> bool:
    """Whether snapshots go to shared memory, where the publisher's coder processes read them."""
    return cfg.publish.coder_processes > 0 and not cfg.publishes_sharded


def weights_of(run: str, version: int, shared: bool = False) -> dict[str, torch.Tensor]:
    """The bf16 weights of `version`: its snapshot (kept for a retry), else the trainer's if
    it holds that version (the first publish of a run)."""
    with _snapshot_lock:
        held = _snapshots.get((run, version))
    if held is not None:
        return held
    trainer = local_trainer(run)
    if trainer.version != version:
        raise RuntimeError(f"trainer holds version {trainer.version}, asked to publish {version}")
    return trainer.weights_bf16(shared=shared)


def _pull_summary(pulled: dict[str, dict]) -> dict:
    """The slowest pull (the step waits for it) and how many needed a full snapshot."""
    records = list(pulled.values())
    worst = lambda key: max((float(r.get(key) or 0.0) for r in records), default=0.0)  # noqa: E731
    return {"pull_s": worst("total_s"), "fetch_s": worst("fetch_s"), "apply_s": worst("apply_s"),
            "load_s": worst("load_s"), "pulled_bytes": int(worst("bytes")),
            "workers_synced": len(records),
            "streamed_buckets": int(worst("streamed")),  # applied before the manifest
            "full_fallbacks": sum(1 for r in records if r.get("mode") == "full" and r.get("fallback")),
            "pull_modes": {r["worker"]: r.get("mode", "noop") for r in records}}
