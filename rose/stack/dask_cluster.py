"""A Dask scheduler and named workers standing for GPUs, as local processes.

Each worker is one `dask worker` process (with a nanny) named after the GPU it stands for
(trainer-0, rollout-0, serving-0) and tagged with that GPU's resource, so tasks pin by name
or resource. Workers get the whole stack's env (Prefect, Mooncake, vLLM on CPU).
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from executors.coserving.plugin import PORT_ENV
from coordination.dask_security import DaskScheduler
from coordination.errors import StackError
from rose.stack.ports import LOCALHOST, pick_port
from rose.stack.process import ManagedProcess, venv_binary
from core.worker_kinds import CLASS_RESOURCE_PREFIX, KIND_OF_RESOURCE, KIND_RESOURCE

WorkerKind = Literal["trainer", "rollout", "serving", "env", "reward"]
REPO_ROOT = Path(__file__).resolve().parents[2]
REGISTER_TIMEOUT_S = 120.0


TRAINER_NICE = 10  # CFS weight ~1/10 of a default process: the engines win a contended core


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    kind: WorkerKind
    nthreads: int
    core: int | None = None  # CPU core vLLM's OpenMP threads bind to (engines would share core 0)
    device: str = "cpu"  # "cuda": its engines split the GPU by memory fraction (engine/device.py)
    # On one CPU machine every "GPU" shares the cores. The trainer stands for GPUs of its own,
    # so it runs niced: it takes the cores the engines leave idle and never delays a serving
    # request (on a cluster it has its own devices and this does nothing).
    nice: int = 0
    device_class: str | None = None  # a rollout worker's class, advertised as resource hw_<class>

    @property
    def resource(self) -> str:
        return KIND_RESOURCE[self.kind]

    @property
    def resources(self) -> str:
        """The worker's --resources: its kind's, and its device class's if it has one."""
        extra = f",{CLASS_RESOURCE_PREFIX}{self.device_class}=1" if self.device_class else ""
        # a reward task takes one reward_cpu: a reward worker scores one trajectory per thread
        units = self.nthreads if self.kind == "reward" else 1
        return f"{self.resource}={units}{extra}"


def worker_specs(trainers: int = 1, rollout: int = 1, serving: int = 0, *, env: int = 0,
                 trainer_threads: int = 1, rollout_threads: int = 2, serving_threads: int = 2,
                 env_threads: int = 8,
                 ncores: int | None = None, device: str = "cpu",
                 rollout_classes: list[str] | None = None) -> list[WorkerSpec]:
    """trainer-i, rollout-i, serving-i, env-i; engine workers spread round-robin over the cores
    (on cuda they bind no core: each engine worker has a GPU); rollout-i of rollout_classes[i];
    environment workers (CPU only) run `env_threads` environment steps at once."""
    if trainers < 0 or rollout < 0 or serving < 0 or env < 0:
        raise StackError("worker counts must be >= 0")
    if rollout_classes and len(rollout_classes) != rollout:
        raise StackError(f"{len(rollout_classes)} device classes for {rollout} rollout workers")
    classes = dict(zip((f"rollout-{i}" for i in range(rollout)), rollout_classes or []))
    ncores = ncores or os.cpu_count() or 1
    specs = [WorkerSpec(f"trainer-{i}", "trainer", trainer_threads,
                        nice=TRAINER_NICE if device == "cpu" else 0) for i in range(trainers)]
    engines = [(f"rollout-{i}", "rollout", rollout_threads) for i in range(rollout)]
    engines += [(f"serving-{i}", "serving", serving_threads) for i in range(serving)]
    specs += [WorkerSpec(n, k, t, core=j % ncores if device == "cpu" else None, device=device,
                         device_class=classes.get(n))
              for j, (n, k, t) in enumerate(engines)]
    specs += [WorkerSpec(f"env-{i}", "env", env_threads) for i in range(env)]
    return specs


def vllm_env(spec: WorkerSpec) -> dict[str, str]:
    """One-process vLLM engines on the worker's device, offline; on CPU a small KV cache and
    OpenMP bound to its own core, on cuda none of that (executors/engine/device.py)."""
    from core.config import vllm_cache_dir
    from executors.engine.device import DeviceSpec, engine_env

    device = DeviceSpec(spec.device)
    return {**device.worker_env(), **engine_env(device, spec.core, vllm_cache_dir())}


def repo_pythonpath() -> str:
    """PYTHONPATH for a service of the stack: this checkout first, then the caller's."""
    return os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)


def worker_env(spec: WorkerSpec, run_dir: Path, base: dict[str, str]) -> dict[str, str]:
    from core.config import data_dir

    return {
        **base,
        **vllm_env(spec),
        "DASK_TEMPORARY_DIRECTORY": str(Path(run_dir).resolve() / "dask"),
        "DASK_DISTRIBUTED__WORKER__DAEMON": "False",  # engines/trainers may start subprocesses
        "PYTHONPATH": repo_pythonpath(),
        "ROSE_DATA_DIR": str(data_dir()),
        "ROSE_WORKER_KIND": spec.kind,
        "ROSE_WORKER_NAME": spec.name,
        # the serving endpoint's port, fixed for the stack's life: a restarted worker keeps its URL
        **({PORT_ENV: str(pick_port(None))} if spec.kind == "serving" else {}),
    }


def worker_identity() -> dict[str, str | None]:
    """Run on a worker: who it is and the stack env it got (for checks and `rose status`)."""
    keys = ("ROSE_WORKER_NAME", "ROSE_WORKER_KIND", "ROSE_RELAY", "PREFECT_API_URL",
            "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING", "ROSE_MOONCAKE_MASTER",
            "ROSE_MOONCAKE_CLIENT")
    return {k: os.environ.get(k) for k in keys}


@dataclass
class DaskCluster:
    scheduler_address: str  # tcp://127.0.0.1:P
    workers: dict[str, str]  # name -> kind
    processes: list[ManagedProcess] = field(default_factory=list, repr=False)

    def stop(self) -> None:
        """Workers first (all at once: each waits on its own grace period), then the scheduler."""
        workers, scheduler = self.processes[1:], self.processes[:1]
        for batch in (workers, scheduler):
            if batch:
                with ThreadPoolExecutor(len(batch)) as pool:
                    list(pool.map(lambda p: p.stop(grace=10), batch))


def start_scheduler(run_dir: Path, port: int | None = None) -> tuple[str, ManagedProcess]:
    port = pick_port(port)
    proc = ManagedProcess("dask-scheduler", [
        venv_binary("dask"), "scheduler", "--host", LOCALHOST, "--port", str(port),
        # without the dashboard Dask still serves /health and /metrics over HTTP, on 0.0.0.0
        # (:8787 on the scheduler, a random port on each worker) unless told where
        "--no-dashboard", "--dashboard-address", f"{LOCALHOST}:0"], run_dir,
        env={"DASK_TEMPORARY_DIRECTORY": str(Path(run_dir).resolve() / "dask")})
    proc.start()
    proc.wait_for_port(LOCALHOST, port, timeout=60)
    return f"tcp://{LOCALHOST}:{port}", proc


# Workers holding vLLM engines import vLLM on a thread as they start (see that module).
ENGINE_PRELOAD = "executors.workers.engine_preload"
ENGINE_KINDS = ("rollout", "serving")


def start_worker(spec: WorkerSpec, scheduler: str, run_dir: Path,
                 base_env: dict[str, str], new_session: bool = True) -> ManagedProcess:
    """new_session=False: in the caller's process group (stopping the caller's group stops it)."""
    local_dir = Path(run_dir).resolve() / "dask" / spec.name
    local_dir.mkdir(parents=True, exist_ok=True)
    return ManagedProcess(f"worker-{spec.name}", worker_command(spec, scheduler, local_dir),
                          run_dir, env=worker_env(spec, run_dir, base_env), cwd=REPO_ROOT,
                          nice=spec.nice, new_session=new_session).start()


def worker_command(spec: WorkerSpec, scheduler: str, local_dir: Path) -> list[str]:
    return [
        venv_binary("dask"), "worker", scheduler, "--name", spec.name,
        # a reward worker has no nanny: the reward pool replaces one that dies (and starts faster)
        "--nthreads", str(spec.nthreads), "--nworkers", "1", "--no-nanny" if spec.kind == "reward" else "--nanny",
        "--resources", spec.resources, "--host", LOCALHOST, "--no-dashboard",
        "--dashboard-address", f"{LOCALHOST}:0",
        "--local-directory", str(local_dir),
        "--death-timeout", "60",  # exit on its own if the scheduler is gone: no orphan
        *(["--preload", ENGINE_PRELOAD] if spec.kind in ENGINE_KINDS else []),
    ]


def wait_for_workers(scheduler: str, procs: dict[str, ManagedProcess],
                     timeout: float = REGISTER_TIMEOUT_S) -> None:
    """Block until every named worker is registered; a crashed or late one is named, with its log."""
    deadline = time.monotonic() + timeout
    with DaskScheduler(scheduler).client() as client:  # the local stack's: plain TCP on 127.0.0.1
        while True:
            names = {w.get("name") for w in client.scheduler_info(n_workers=-1)["workers"].values()}
            absent = [n for n in procs if n not in names]
            if not absent:
                return
            for name in absent:
                if not procs[name].running():
                    code = procs[name].popen.returncode
                    raise procs[name].fail(f"exited (code {code}) before registering with {scheduler}")
            if time.monotonic() > deadline:
                raise procs[absent[0]].fail(f"did not register with {scheduler} within {timeout:.0f} s")
            time.sleep(0.2)


def start_dask(run_dir: Path, specs: list[WorkerSpec], base_env: dict[str, str],
               scheduler_port: int | None = None,
               timeout: float = REGISTER_TIMEOUT_S) -> DaskCluster:
    """Start the scheduler and one worker process per spec; wait until all are registered."""
    if len({s.name for s in specs}) != len(specs):
        raise StackError("worker names must be unique")
    address, scheduler = start_scheduler(run_dir, scheduler_port)
    cluster = DaskCluster(address, {s.name: s.kind for s in specs}, [scheduler])
    try:
        procs = {}
        for spec in specs:
            procs[spec.name] = start_worker(spec, address, run_dir, base_env)
            cluster.processes.append(procs[spec.name])
        wait_for_workers(address, procs, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def check_workers(scheduler: DaskScheduler, needed: tuple[str, ...] = ("train_gpu", "rollout_gpu"),
                  timeout: float = 30.0) -> dict[str, str]:
    """For an existing scheduler: name -> kind of its workers; error if a resource is missing."""
    try:
        with scheduler.client(timeout) as client:
            workers = client.scheduler_info(n_workers=-1)["workers"].values()
    except (OSError, TimeoutError) as e:  # a refused TLS handshake too: say why
        why = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise StackError(f"Dask scheduler at {scheduler.address} does not answer "
                         f"({type(e).__name__}{': ' + why if why else ''})") from None
    kinds = KIND_OF_RESOURCE
    out, have = {}, set()
    for w in workers:
        res = set(w.get("resources") or {})
        have |= res
        kind = next((kinds[r] for r in res if r in kinds), "other")
        out[str(w.get("name"))] = kind
    lacking = [r for r in needed if r not in have]
    if lacking:
        raise StackError(f"Dask scheduler at {scheduler.address} has no worker with {', '.join(lacking)}")
    return out
