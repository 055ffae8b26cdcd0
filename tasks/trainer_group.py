"""Calling every rank of a megatron trainer group (train.backend: megatron) from a task or flow.

The group is tp x pp x dp ranks on the stack's trainer workers trainer-0..N-1 (rank r on
trainer-r); `on_ranks` forms it through the Dask scheduler when needed (a first call, a rank
that restarted: executors/workers/train_group.py) and runs one function on every rank at once,
as SPMD training needs. Called from inside a task on a trainer worker, leave the worker's thread
pool first (tasks/worker_threads.py): that worker's only thread is one of the ranks'.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from distributed import Client

from executors.workers.train_group import held_group, join_group, rendezvous_point
from core.config import RunConfig
from tasks.placement import require, workers_by_kind


def _rank_order(name: str) -> tuple[int, str]:
    tail = name.rsplit("-", 1)[-1]
    return (int(tail) if tail.isdigit() else 0, name)


def trainer_ranks(client: Client, cfg: RunConfig, restart_wait_s: float = 120.0) -> list[str]:
    """The trainer workers holding ranks 0..world-1 (waiting for one its nanny is restarting);
    a clear error when the stack has too few."""
    par = cfg.train.parallel
    deadline = time.monotonic() + restart_wait_s
    while True:
        names = sorted(require(workers_by_kind(client), "trainer"), key=_rank_order)
        if len(names) >= par.world or time.monotonic() > deadline or not _had_group(client, cfg, names):
            break
        time.sleep(1.0)  # a rank of this run's group is gone: its nanny restarts it within seconds
    if len(names) < par.world:
        raise ValueError(f"train.parallel tp={par.tp} pp={par.pp} dp={par.dp} needs {par.world} trainer "
                         f"workers, the stack has {len(names)}: start it with `rose up --trainers {par.world}`")
    return names[: par.world]


def _had_group(client: Client, cfg: RunConfig, names: list[str]) -> bool:
    """Whether a trainer still holds this run's group: then a missing rank is restarting (its
    worker left the scheduler when it died), not absent from the stack."""
    return any(g is not None for g in _each(client, names, held_group, cfg.run_id))


def _each(client: Client, names: list[str], fn: Callable, *args: Any) -> list:
    return client.gather([client.submit(fn, *args, workers=[name], allow_other_workers=False,
                                        pure=False) for name in names])


def ensure_group(client: Client, cfg: RunConfig) -> list[str]:
    """Every rank in one group of this run (formed anew if not); the ranks' worker names."""
    names = trainer_ranks(client, cfg)
    held = _each(client, names, held_group, cfg.run_id)
    if held[0] is not None and len(set(held)) == 1:
        return names
    host, port = client.submit(rendezvous_point, workers=[names[0]], allow_other_workers=False,
                               pure=False).result()
    futures = [client.submit(join_group, cfg, rank, host, port, cfg.stack.device, workers=[name],
                             allow_other_workers=False, pure=False) for rank, name in enumerate(names)]
    versions = client.gather(futures)
    if len(set(versions)) != 1:
        raise RuntimeError(f"trainer ranks resumed different versions {versions}: their checkpoints disagree")
    return names


def on_ranks(client: Client, cfg: RunConfig, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """fn(cfg, *args) on every rank at once (rank order); the group formed first if needed."""
    names = ensure_group(client, cfg)
    return _each(client, names, fn, cfg, *args)
