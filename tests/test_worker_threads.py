"""A task that leaves a Dask worker's thread pool must not hand its contextvars to the next task.

One worker thread: task A sets a context variable (as Prefect's TaskRunContext and transaction
are set around a task), then leaves the pool; task B, queued behind it, starts in the freed
slot and reads the variable. distributed starts B from A's secede callback, in a copy of A's
context, so with a plain `secede()` B sees A's value: that is how a Prefect task's cache record
ended up in another task's transaction (tasks/worker_threads.py). Real in-process Dask cluster;
events, not sleeps, order A and B.
"""
from __future__ import annotations

import contextvars
import threading
import time

import pytest
from distributed import Client, LocalCluster, secede

from tasks.worker_threads import client_outside_thread_pool, leave_thread_pool

OWNER = contextvars.ContextVar("owner")
A_RUNNING, LEAVE, B_STARTED = threading.Event(), threading.Event(), threading.Event()


def _a(leave) -> str:
    OWNER.set("task A")
    A_RUNNING.set()
    assert LEAVE.wait(30)  # B is queued behind A on the worker's one thread
    leave()
    assert B_STARTED.wait(30)  # B runs in the slot A left
    return "a"


def _b() -> str | None:
    B_STARTED.set()
    return OWNER.get(None)


def _with_client() -> None:
    with client_outside_thread_pool() as client:
        assert client.scheduler_info()["workers"]


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as c, Client(c) as client:
        yield client, next(iter(c.workers.values()))


def _seen_by_next_task(cluster, leave) -> str | None:
    client, worker = cluster
    for event in (A_RUNNING, LEAVE, B_STARTED):
        event.clear()
    a = client.submit(_a, leave, pure=False)
    assert A_RUNNING.wait(30)
    b = client.submit(_b, pure=False)
    deadline = time.monotonic() + 30
    while getattr(worker.state.tasks.get(b.key), "state", None) != "ready":
        assert time.monotonic() < deadline, "task B never queued behind A"
        time.sleep(0.01)
    LEAVE.set()
    assert a.result(timeout=30) == "a"
    return b.result(timeout=30)


def test_plain_secede_hands_its_context_to_the_next_task(cluster):
    # the reason for tasks/worker_threads.py: if distributed stops doing this, it can go
    assert _seen_by_next_task(cluster, secede) == "task A"


def test_leaving_the_pool_keeps_each_task_in_its_own_context(cluster):
    assert _seen_by_next_task(cluster, leave_thread_pool) is None


def test_a_second_leave_is_a_no_op_and_the_client_rejoins(cluster):
    client, _ = cluster

    def twice() -> tuple[bool, bool]:
        return leave_thread_pool(), leave_thread_pool()

    assert client.submit(twice, pure=False).result(timeout=30) == (True, False)
    # the client context leaves and rejoins: the worker's one thread runs the next task
    client.submit(_with_client, pure=False).result(timeout=30)
    assert client.submit(_b, pure=False).result(timeout=30) is None
