"""Leaving the Dask worker's thread pool from inside a Prefect task without leaking its context.

distributed's `secede()` and `worker_client()` tell the worker's event loop from the task's
thread (`loop.add_callback`), and asyncio runs that callback, and every task execution it
starts, in a copy of the calling thread's contextvars. The next Prefect task started on that
worker then began inside this task's TaskRunContext and transaction: its cache record committed
(or rolled back) with this task's transaction instead of its own. Seen in a pipelined run that
stopped: step 3's rollout had finished, but its record went with step 2's train transaction, so
the resume recomputed it. Seceding from a context that holds only distributed's own variables
(the worker running the task) keeps every task in its own.
"""
from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import distributed.worker
from distributed import Client, rejoin, secede, worker_client

_DASK_VARS = [v for v in vars(distributed.worker).values() if isinstance(v, contextvars.ContextVar)]


def _dask_only_context() -> contextvars.Context:
    """A context with this thread's values of distributed's variables and nothing else."""
    current, clean = contextvars.copy_context(), contextvars.Context()
    for var in _DASK_VARS:
        if var in current:
            clean.run(var.set, current[var])
    return clean


def leave_thread_pool() -> bool:
    """secede() from a context holding only distributed's variables; False if this thread had
    already left the pool."""
    try:
        _dask_only_context().run(secede)
    except KeyError:  # distributed: this thread is no longer one of the pool's
        return False
    return True


@contextmanager
def client_outside_thread_pool() -> Iterator[Client]:
    """`worker_client()`, leaving the pool as above; rejoins it on exit if it left."""
    left = leave_thread_pool()
    try:
        with worker_client(separate_thread=False) as client:
            yield client
    finally:
        if left:
            rejoin()
