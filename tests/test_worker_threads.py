"""A task that leaves a Dask worker's thread pool must not hand its contextvars to the next task.

One worker thread: task A sets a context variable (as Prefect's TaskRunContext and transaction
are set around a task), then leaves the pool; task B, queued behind A, starts in the freed
slot and reads the variable. distributed starts B from A's secede callback, in a copy of A's
context, so with a plain `secede()` B sees A's value: that is how a Prefect task's cache record
ended up in another task's transaction (tasks/worker_threads.py). Real in-process Dask cluster.
"""
from __future__ import annotations

import contextvars
import time

import pytest
from distributed import Client, LocalCluster, secede

from tasks.worker_threads import client_outside_thread_pool, leave_thread_pool

OWNER = contextvars.ContextVar("owner")


def _a(leave) -> str:
    OWNER.set("task A")
    time.sleep(0.3)  # B is queued behind A on the worker's one thread
    leave()
    time.sleep(0.6)  # B runs in the slot A left
    return "a"


def _with_client() -> None:
    with client_outside_thread_pool() as client:
        assert client.scheduler_info()["workers"]
        time.sleep(0.6)


def _b() -> str | None:
    return OWNER.get(None)


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def _seen_by_next_task(client, leave) -> str | None:
    a = client.submit(_a, leave, pure=False)
    b = client.submit(_b, pure=False)
    assert a.result(timeout=30) == "a"
    return b.result(timeout=30)


def test_plain_secede_hands_its_context_to_the_next_task(client):
    # the reason for tasks/worker_threads.py: if distributed stops doing this, it can go
    assert _seen_by_next_task(client, secede) == "task A"


def test_leaving_the_pool_keeps_each_task_in_its_own_context(client):
    assert _seen_by_next_task(client, leave_thread_pool) is None


def test_a_second_leave_is_a_no_op_and_the_client_rejoins(client):
    def twice() -> tuple[bool, bool]:
        return leave_thread_pool(), leave_thread_pool()

    assert client.submit(twice, pure=False).result(timeout=30) == (True, False)
    # the client context leaves and rejoins: the worker's one thread runs the next task
    client.submit(_with_client, pure=False).result(timeout=30)
    assert client.submit(_b, pure=False).result(timeout=30) is None
