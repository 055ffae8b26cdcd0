"""Pinned functions are waited for only while their worker lives (executors/workers/pinned.py):
a worker that leaves mid-wait, one that is not there, or one that never answers is left out
with the reason, never waited for forever (a publish once hung on a half-started worker)."""
from __future__ import annotations

import threading
import time

import pytest
from distributed import Client, LocalCluster

from executors.workers.pinned import gather_live, submit_pinned

RELEASE = threading.Event()


def _blocked() -> str:
    RELEASE.wait(60)
    return "released"


def _name() -> str:
    from distributed import get_worker

    return str(get_worker().name)


@pytest.fixture
def client():
    with LocalCluster(n_workers=2, processes=False, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c
    RELEASE.clear()


def _names(client: Client) -> dict[str, str]:
    return {str(w["name"]): a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}


def test_results_of_live_workers_and_absent_ones_left_out(client):
    names = sorted(_names(client))
    pinned, left = submit_pinned(client, _name, [*names, "ghost"])
    results, late = gather_live(client, pinned, timeout_s=30)
    assert results == {n: n for n in names} and not late
    assert list(left) == ["ghost"] and "not running" in left["ghost"]


def test_worker_leaving_mid_wait_is_left_out_not_waited_for(client):
    victim = sorted(_names(client))[1]
    pinned, _ = submit_pinned(client, _blocked, [victim])
    threading.Timer(0.5, lambda: client.retire_workers([_names(client)[victim]],
                                                       close_workers=True)).start()
    t0 = time.monotonic()
    results, left = gather_live(client, pinned, timeout_s=60, poll_s=0.1)
    RELEASE.set()
    assert not results and "left the cluster" in left[victim]
    assert time.monotonic() - t0 < 20  # not the 60 s deadline: it noticed the worker go


def test_silent_worker_left_out_at_the_deadline(client):
    worker = sorted(_names(client))[0]
    pinned, _ = submit_pinned(client, _blocked, [worker])
    t0 = time.monotonic()
    results, left = gather_live(client, pinned, timeout_s=1.0, poll_s=0.1)
    RELEASE.set()
    assert not results and "no answer within 1 s" in left[worker]
    assert time.monotonic() - t0 < 10


def test_a_workers_own_error_is_raised(client):
    def boom() -> None:
        raise ValueError("pull failed")

    pinned, _ = submit_pinned(client, boom, sorted(_names(client))[:1])
    with pytest.raises(ValueError, match="pull failed"):
        gather_live(client, pinned, timeout_s=30)
