"""Functions pinned to named workers, waited for only while those workers live.

A Dask task pinned to a worker (`workers=[name]`, `allow_other_workers=False`) is bound to
that worker's address. If the worker dies, or its nanny restarts it and the new process never
finishes starting (registered with status "init" while its plugins, the vLLM engine, set up;
or stuck there), the task waits in the scheduler forever, and so does whoever gathers it: a
publish that pinned its weight pull to a half-started rollout worker never returned.

`submit_pinned` only pins to workers that run now; `gather_live` waits for each future while
the worker it was pinned to is still registered at that address and running, and at most
`timeout_s`. Workers that left (or never answered) are handed back with the reason, their
futures cancelled: the caller goes on without them (a rollout worker that comes back resyncs
its weights before the rollout scheduler routes turns to it again).
"""
from __future__ import annotations

import time
from concurrent.futures import CancelledError
from typing import Any, Callable

from distributed import Client, Future, wait
from distributed.client import FutureCancelledError
from distributed.scheduler import KilledWorker

Pinned = dict[str, tuple[str, Future]]  # worker name -> (address pinned to, future)
FETCH_TIMEOUT_S = 30.0  # fetching a finished (small) result from a live worker takes ms


class LostResult(TimeoutError):
    """A finished task's result could not be fetched in time (its worker died holding it)."""


def fetch_result(fut: Future, timeout_s: float = FETCH_TIMEOUT_S) -> Any:
    """The result of a finished pinned future. A worker that died holding it makes Dask
    recompute the task on that dead address, so an unbounded result() never returns: after
    `timeout_s` the future is cancelled and LostResult raised (the caller treats the worker
    as lost). The function's own errors are raised as they are."""
    try:
        return fut.result(timeout=timeout_s)
    except TimeoutError as e:
        if fut.status == "error":  # the function itself raised a TimeoutError
            raise
        fut.cancel()
        raise LostResult(f"result of {fut.key} not fetched within {timeout_s:g} s") from e


def running_workers(client: Client) -> dict[str, str]:
    """Name -> address of every worker whose status is "running" (not starting, not closing)."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return {str(w.get("name")): addr for addr, w in info.items()
            if w.get("status", "running") == "running"}


def submit_pinned(client: Client, fn: Callable, workers: list[str], *args) -> tuple[Pinned, dict[str, str]]:
    """fn(*args) on each running worker of `workers`, pinned to its current address; and
    worker -> why for those not pinned (absent, or not running yet)."""
    live = running_workers(client)
    pinned: Pinned = {}
    left: dict[str, str] = {}
    for name in workers:
        address = live.get(name)
        if address is None:
            left[name] = "not running (gone, or restarting and not started yet)"
            continue
        pinned[name] = (address, client.submit(fn, *args, workers=[address],
                                               allow_other_workers=False, pure=False))
    return pinned, left


def gather_live(client: Client, pinned: Pinned, timeout_s: float,
                poll_s: float = 0.5) -> tuple[dict[str, Any], dict[str, str]]:
    """(worker -> result, worker -> why it was left out). A worker's own error (its function
    raised) is raised here; a worker that left, restarted or did not answer within
    `timeout_s` is left out instead."""
    results: dict[str, Any] = {}
    left: dict[str, str] = {}
    pending = dict(pinned)
    deadline = time.monotonic() + timeout_s
    while pending:
        for name, (_, fut) in list(pending.items()):
            if fut.done():
                del pending[name]
                try:
                    results[name] = fetch_result(fut)
                except (KilledWorker, CancelledError, FutureCancelledError, LostResult) as e:
                    left[name] = f"worker lost while it ran: {type(e).__name__}"
        if not pending:
            break
        live = running_workers(client)
        expired = time.monotonic() > deadline
        for name, (address, fut) in list(pending.items()):
            if live.get(name) != address or expired:
                left[name] = (f"no answer within {timeout_s:g} s" if live.get(name) == address
                              else "left the cluster or restarted while waited for")
                fut.cancel()
                del pending[name]
        if pending:
            try:
                wait([f for _, f in pending.values()], timeout=poll_s,
                     return_when="FIRST_COMPLETED")
            except TimeoutError:
                pass
    return results, left
