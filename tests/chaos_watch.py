"""What the chaos faults watch and touch from outside the product: the Dask scheduler (which
worker runs which task), the stack file's pids, the nanny's children, the run's checkpoints,
and each engine's pull agent as Dask reports it."""
from __future__ import annotations

import os
import signal
import time

import psutil
from distributed import Client

from tests.chaos_stack import Bed


def scheduler_of(bed: Bed) -> str:
    return bed.stack()["dask_scheduler"]


def address_of(client: Client, name: str) -> str | None:
    """The worker's address, None while no worker of that name is registered (starting, or
    restarting after a kill)."""
    return next((a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                 if w["name"] == name), None)


def wait_task(client: Client, worker: str, prefix: str, timeout_s: float) -> None:
    """Until `worker` runs a task whose key starts with `prefix` (a Prefect task's Dask key
    is its task name and a token: `train-1a2b`, `publish-...`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        address = address_of(client, worker)
        if address is not None and any(str(k).startswith(prefix) for k in client.processing(workers=[address])
               .get(address, ())):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{worker} never ran a {prefix!r} task within {timeout_s:g} s")


def freeze_new_child(parent: int, known: set[int], timeout_s: float = 120.0) -> int:
    """SIGSTOP the first new worker process `parent` spawns (not multiprocessing's resource
    tracker; the worker renames itself `dask worker [...]` once started, so match by pid)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(parent).children():
            try:
                if child.pid not in known and "resource_tracker" not in " ".join(child.cmdline()):
                    os.kill(child.pid, signal.SIGSTOP)
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.01)
    raise TimeoutError(f"process {parent} started no new worker within {timeout_s:g} s")


def pull_records(bed: Bed, version: int, timeout_s: float = 300) -> dict:
    """Each engine worker's pull of `version`, as its pull agent reports it (via Dask)."""
    from executors.workers.weight_sync import pull_status

    deadline = time.monotonic() + timeout_s
    with Client(scheduler_of(bed), timeout=30) as client:
        engines = [a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                   if w["name"] != "trainer-0"]
        while time.monotonic() < deadline:
            st = client.gather([client.submit(pull_status, bed.run_id, workers=[a],
                                               pure=False) for a in engines])
            last = {s["worker"]: s.get("last") or {} for s in st if s.get("last")}
            if last and all((r.get("version") or -1) >= version for r in last.values()):
                return {w: {k: r.get(k) for k in ("version", "mode", "fallback", "error")}
                        for w, r in last.items()}
            time.sleep(0.2)
    return {"error": f"no pull of v{version} finished within {timeout_s:g} s"}


def wait_checkpoint(bed: Bed, step: int, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while step not in bed.checkpoints():
        if time.monotonic() > deadline:
            raise TimeoutError(f"step {step} never checkpointed")
        time.sleep(0.1)


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
