"""Publish phase: the trainer pushes the new policy through the relay; rollout workers pull it
and reload their engines in place. Verified end to end by a digest of the exact bits."""
from __future__ import annotations

import time

from distributed import worker_client
from prefect import task
from prefect.cache_policies import NO_CACHE

from executors.rollout_worker import sync_weights, weights_digest
from executors.trainer import local_trainer
from rose.config import RunConfig
from storage.relay_pool import shared_relay
from storage.weight_publisher import publish_weights
from tasks.placement import require, workers_by_kind


# Never cached: publishing is idempotent and must leave every rollout worker on `version`.
@task(name="publish", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def publish(cfg: RunConfig, version: int) -> dict:
    return publish_and_sync(cfg, version)


def publish_and_sync(cfg: RunConfig, version: int) -> dict:
    """Push `version` from this (trainer) worker and wait until every rollout worker runs it."""
    trainer = local_trainer(cfg.run_id)
    if trainer.version != version:
        raise RuntimeError(f"trainer holds version {trainer.version}, asked to publish {version}")
    t0 = time.perf_counter()
    tensors = trainer.weights_bf16()
    digest = weights_digest(tensors)
    stats = publish_weights(shared_relay(cfg.stack.relay), cfg.run_id, version, tensors,
                            cfg.publish.bucket_bytes)
    push_s = time.perf_counter() - t0
    with worker_client() as client:
        names = require(workers_by_kind(client), "rollout")
        futures = [client.submit(sync_weights, cfg.stack.relay, cfg.run_id, version,
                                 cfg.publish.pull_batch_bytes, workers=[n],
                                 allow_other_workers=False, pure=False) for n in names]
        pulled = client.gather(futures)
    stale = [p["worker"] for p in pulled if p["digest"] != digest]
    if stale:
        raise RuntimeError(f"workers {stale} hold weights that differ from version {version}")
    return {"version": version, "digest": digest, "bytes": stats.bytes, "buckets": stats.buckets,
            "push_s": push_s, "pull_s": max(p["pull_s"] + p["load_s"] for p in pulled),
            "publish_s": time.perf_counter() - t0, "workers": pulled}
