"""`rose deploy`: the work pool, the deployments of prefect.yaml, and a process worker.

The worker runs as part of the local stack (pid file under the stack directory, so `rose down`
stops it) with the stack's environment, so flow runs started from the UI find the Dask
scheduler, the Prefect server, the relay and the data directory exactly as `rose train` does.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from coordination.errors import StackError
from coordination.processes import ProcessRecord, read_records
from rose.stack.process import ManagedProcess, venv_binary

POOL = "rose-process"
WORKER = "prefect-worker"  # process name in the stack's pids/ and logs/
REPO_ROOT = Path(__file__).resolve().parents[1]
DEPLOY_TIMEOUT_S = 300


@dataclass
class Deployed:
    deployments: list[str]  # "flow/deployment"
    worker_pid: int
    worker_reused: bool
    ui_url: str


def worker_env(stack_env: dict[str, str]) -> dict[str, str]:
    """The stack env plus what flow runs of deployments need: the checkout and fast pickup."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**stack_env, "ROSE_REPO_ROOT": str(REPO_ROOT), "PYTHONPATH": pythonpath,
            "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "2"}


def ensure_work_pool(name: str = POOL) -> bool:
    """Create the process work pool unless it exists; True when created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
            return False
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(
                name=name, type="process",
                base_job_template=ProcessWorker.get_default_base_job_template(),
                description="ROSE flows: train, rl-step, benchmarks (rose deploy)"))
            return True


def _prefect(args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run([venv_binary("prefect"), "--no-prompt", *args], cwd=REPO_ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=DEPLOY_TIMEOUT_S)
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        last = next((ln.strip() for ln in reversed(out.splitlines()) if ln.strip()), "")
        raise StackError(f"prefect {' '.join(args)} failed (exit {proc.returncode}): {last[:300]}")
    return out


# flow/deployment, as prefect.yaml defines them
DEPLOYMENTS = ("train/train", "rl-step/rl-step", "benchmarks/benchmarks",
               "serving-replay/serving-replay", "cluster-sim/cluster-sim", "paper-figures/paper-figures")


def deploy_all(env: dict[str, str]) -> list[str]:
    """Every deployment of prefect.yaml; their full names."""
    _prefect(["deploy", "--all"], env)
    return list(DEPLOYMENTS)


def running_worker(run_dir: Path) -> ProcessRecord | None:
    return next((r for r in read_records(run_dir) if r.name == WORKER and r.alive()), None)


def online_workers(pool: str = POOL) -> list[str]:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return [w.name for w in client.read_workers_for_work_pool(pool)
                if str(getattr(w.status, "value", w.status)).upper() == "ONLINE"]


def start_worker(run_dir: Path, env: dict[str, str], timeout: float = 120.0) -> ManagedProcess:
    """`prefect worker start` on the pool; returns once the server lists it online."""
    name = f"rose-{os.uname().nodename}-{run_dir.parent.name}"[:60]
    proc = ManagedProcess(WORKER, [venv_binary("prefect"), "worker", "start", "--pool", POOL,
                                   "--type", "process", "--name", name],
                          run_dir, env=env, cwd=REPO_ROOT).start()
    proc.wait_until(lambda: name in online_workers(), f"come online in pool {POOL}", timeout)
    return proc


def deploy(cfg, console) -> Deployed:
    """Stack (reused or started) -> pool -> deployments -> worker (reused if alive)."""
    from core.config import stack_dir
    from rose.launch import ensure_stack
    from rose.stack.local_stack import stack_env

    handle = ensure_stack(cfg, console)
    env = worker_env(stack_env(handle))
    ensure_work_pool()
    with console.status("deploying prefect.yaml (prefect deploy --all)"):
        names = deploy_all(env)
    record = running_worker(stack_dir())
    if record is None:
        with console.status(f"starting a process worker on pool {POOL}"):
            pid = start_worker(stack_dir(), env).pid
        reused = False
    else:
        pid, reused = record.pid, True
    return Deployed(names, pid, reused, handle.prefect_ui_url)

