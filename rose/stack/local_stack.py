"""The local stack as one handle: Prefect server, Mooncake services, Dask scheduler and workers.

start_stack() starts what is missing and writes run_dir/stack.json (addresses + pids), so
`rose down`/`rose status` in another process find it (the record and whether its parts are
alive: coordination/stack_record.py). A Mooncake failure is not fatal: the
relay falls back to the filesystem, loudly.

The services are started by the stack's supervisor (rose/stack/supervisor.py), a process of
its own that outlives the `rose` command which asked for the stack: it is their parent, restarts
one that exits unasked and records each restart here; `rose down` stops it first.
"""
from __future__ import annotations

import fcntl
import os
import sys
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.panel import Panel

from coordination.dask_security import DaskScheduler
from coordination.errors import StackError
from coordination.processes import ProcessRecord, group_members, read_records
from coordination.stack_record import STACK_FILE, StackHandle, load_stack, read_stack
from core.config import StackConfig, data_dir
from rose.stack.dask_cluster import REPO_ROOT, check_workers, repo_pythonpath, start_dask, worker_specs
from rose.stack.mooncake import MooncakeServices, mooncake_env, start_mooncake
from rose.stack.ports import ensure_free
from rose.stack.prefect_server import check_prefect, launch_prefect_server, prefect_env, prefect_home
from rose.stack.process import ManagedProcess
from storage.atomic import write_atomic
from storage.weights.arena_files import sweep_dead

SUPERVISOR_ENV = "ROSE_STACK_SUPERVISOR_PID"  # storage.relay.mooncake reads it by this name
err_console = Console(stderr=True)


@contextmanager
def _locked(run_dir: Path):
    """One start/stop at a time per stack directory (two `rose up` must not race)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def start_stack(cfg: StackConfig, run_dir: Path, *, prefect_port: int | None = None,
                scheduler_port: int | None = None) -> StackHandle:
    """Start (or reuse) the stack of run_dir; on any failure stop what was started, then raise.
    The services are started by the stack's supervisor process (their parent from then on),
    which this waits for."""
    from rose.stack.supervisor_launch import launch

    run_dir = Path(run_dir).resolve()
    with _locked(run_dir):
        running = load_stack(run_dir)
        if running is not None:
            return running
        _stop_stack(run_dir)  # leftovers of a stack that died half-way
        for port in (prefect_port, scheduler_port):  # fail before starting anything
            if port:
                ensure_free(port)
        said, handle = launch(cfg, run_dir, prefect_port, scheduler_port)
        if said:
            err_console.file.write(said)  # the start's warnings (Mooncake), as rendered there
        return handle


def start_services(cfg: StackConfig, run_dir: Path, prefect_port: int | None,
                   scheduler_port: int | None) -> tuple[StackHandle, list[ManagedProcess]]:
    """Start every service of the stack in this process (the supervisor's); the handle (not
    written yet) and the processes. On any failure stop what was started, then raise."""
    started: list = []
    try:
        # Prefect's ~10 s start-up overlaps Mooncake's and Dask's; workers only need its URL.
        if cfg.prefect_api_url:
            check_prefect(cfg.prefect_api_url)
            api_url, home, server = cfg.prefect_api_url.rstrip("/"), prefect_home(run_dir), None
        else:
            server = launch_prefect_server(run_dir, prefect_port)
            started.append(server)
            api_url, home = server.api_url, server.home
        mooncake = _start_relay(cfg, run_dir)
        if mooncake:
            started.append(mooncake)
        relay = "mooncake" if mooncake else "filesystem"
        # SUPERVISOR_ENV: this process (the supervisor, rose/stack/supervisor.py) restarts a
        # service that dies; a relay op waits for a restarting master only while it lives
        base_env = {**prefect_env(api_url, home), "ROSE_RELAY": relay, "ROSE_RUN_DIR": str(run_dir),
                    SUPERVISOR_ENV: str(os.getpid()),
                    **(mooncake_env(mooncake) if mooncake else {})}
        if cfg.dask_scheduler:
            scheduler = cfg.dask_scheduler
            workers = check_workers(DaskScheduler(cfg.dask_scheduler, cfg.dask_tls))
        else:
            specs = worker_specs(cfg.trainers, cfg.rollout_workers, cfg.serving_workers, env=cfg.env_workers,
                                 device=cfg.device, rollout_classes=cfg.rollout_device_classes)
            cluster = start_dask(run_dir, specs, base_env, scheduler_port)
            started.append(cluster)
            scheduler, workers = cluster.scheduler_address, cluster.workers
        if cfg.reward_workers:
            started.append(start_reward_pool(cfg, scheduler, run_dir, base_env))
        if server is not None:
            server.wait()
    except BaseException:
        for service in reversed(started):
            service.stop()
        raise
    procs = [p for s in started for p in _processes(s)]
    handle = StackHandle(run_dir, api_url, api_url.removesuffix("/api"), scheduler,
                         mooncake.master_addr if mooncake else None,
                         mooncake.metadata_url if mooncake else None, relay, workers,
                         str(home), [p.record for p in procs],
                         mooncake_client=mooncake.client_addr if mooncake else None,
                         dask_tls=cfg.dask_tls.model_dump(mode="json") if cfg.dask_tls else None)
    return handle, procs


def write_stack(handle: StackHandle) -> None:
    """(Re)write the stack file atomically: a reader never sees half of it."""
    run_dir = Path(handle.run_dir)
    with _file_locked(run_dir):
        write_atomic(run_dir / STACK_FILE, handle.to_json())


@contextmanager
def _file_locked(run_dir: Path):
    """One writer of the stack file at a time (the supervisor records restarts in it while a
    `rose` command records endpoints); not the start/stop lock, which `rose down` holds while
    it waits for the supervisor."""
    with open(Path(run_dir) / ".stack-file.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def update_stack(run_dir: Path, change) -> StackHandle | None:
    """Read the stack file, `change(handle)` it and write it back, as one step against other
    writers; None (nothing written) when there is no stack file (stopped meanwhile)."""
    run_dir = Path(run_dir)
    with _file_locked(run_dir):
        handle = read_stack(run_dir)
        if handle is None:
            return None
        change(handle)
        write_atomic(run_dir / STACK_FILE, handle.to_json())
        return handle


def start_reward_pool(cfg: StackConfig, scheduler: str, run_dir: Path,
                      base_env: dict[str, str]) -> ManagedProcess:
    """The elastic reward pool's controller (rose/stack/reward_pool.py): it starts no worker
    until rewards wait for one."""
    return ManagedProcess("reward-pool", [
        sys.executable, "-m", "rose.stack.reward_pool", "--scheduler", scheduler,
        "--run-dir", str(run_dir), "--max-workers", str(cfg.reward_workers),
        "--min-workers", str(cfg.reward_workers_min), "--threads", str(cfg.reward_threads)],
        run_dir, env={**base_env, "PYTHONPATH": repo_pythonpath()}, cwd=REPO_ROOT).start()


def _processes(service) -> list:
    if isinstance(service, ManagedProcess):
        return [service]
    if hasattr(service, "processes"):
        return list(service.processes)
    return [service.process] if getattr(service, "process", None) else []


def _start_relay(cfg: StackConfig, run_dir: Path) -> MooncakeServices | None:
    """relay 'auto': Mooncake, else the filesystem relay, loudly; 'mooncake': Mooncake or error."""
    if cfg.relay == "filesystem":
        return None
    try:
        services = start_mooncake(run_dir, store_mb=cfg.relay_store_mb)
        if services.client_error:
            err_console.print(Panel(
                f"[bold]Mooncake's store client could not start:[/]\n{services.client_error}\n"
                "Published weights live in the publisher's own segment and every get crosses\n"
                "loopback TCP (~10x slower between processes of this host).",
                title="WARNING: no Mooncake store client", border_style="bold red"))
        return services
    except StackError as e:
        if cfg.relay == "mooncake":
            raise
        err_console.print(Panel(
            f"[bold]Mooncake could not start:[/] {e}\n"
            f"Weights will move through the [bold]FILESYSTEM relay[/] ({run_dir / 'relay'}),\n"
            "which is slower and only works on one machine.",
            title="WARNING: no Mooncake relay", border_style="bold red"))
        return None


def stop_stack(run_dir: Path) -> list[str]:
    """Stop every process the stack of run_dir started; verify none is left. Returns their names."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        return []
    with _locked(run_dir):
        return _stop_stack(run_dir)


def _stop_stack(run_dir: Path) -> list[str]:
    """The supervisor first (it stops restarting at once, then stops the services, workers
    first, and exits last), then whatever is left by pid: a supervisor that is gone or did
    not finish, services of a start that failed half-way."""
    from rose.stack.supervisor_launch import read_supervisor, stop_supervisor

    handle = read_stack(run_dir)
    before = {p.pid: p for p in _records(run_dir, handle) if p.alive()}
    supervisor = (handle.supervisor if handle and handle.supervisor else None) or read_supervisor(run_dir)
    stopped_supervisor = supervisor is not None and supervisor.alive()
    if stopped_supervisor:
        stop_supervisor(supervisor)
    records = {p.pid: p for p in _records(run_dir, read_stack(run_dir) or handle)}
    records.update(before)
    live = [p for p in records.values() if p.alive()]
    workers = [p for p in live if p.name.startswith("worker-")]
    others = [p for p in live if not p.name.startswith("worker-")]
    for batch in (workers, others):  # workers first, so they do not chase a dead scheduler
        if batch:
            with ThreadPoolExecutor(len(batch)) as pool:
                list(pool.map(lambda p: p.stop(grace=10), batch))
    left = [f"{p.name} (pid {p.pid})" for p in records.values() if p.alive() or group_members(p.pid)]
    if left:
        raise StackError(f"could not stop: {', '.join(left)}")
    for p in records.values():
        (run_dir / "pids" / f"{p.name}.json").unlink(missing_ok=True)
    (run_dir / STACK_FILE).unlink(missing_ok=True)
    (run_dir / "supervisor.json").unlink(missing_ok=True)
    sweep_dead()  # a stopped trainer's snapshots in /dev/shm (coder processes) go with it
    names = list(dict.fromkeys(p.name for p in before.values()))
    return names + (["supervisor"] if stopped_supervisor else [])


def _records(run_dir: Path, handle: StackHandle | None) -> list[ProcessRecord]:
    """Every service the stack file names, and every pid file (a start that failed half-way)."""
    records = {p.pid: p for p in (handle.processes if handle else [])}
    for p in read_records(run_dir):
        records.setdefault(p.pid, p)
    return list(records.values())


def stack_env(handle: StackHandle) -> dict[str, str]:
    """Env for the driver process (the one running flows) to use this stack."""
    env = {
        **prefect_env(handle.prefect_api_url, Path(handle.prefect_home or prefect_home(handle.run_dir))),
        "DASK_TEMPORARY_DIRECTORY": str(Path(handle.run_dir) / "dask"),
        "ROSE_DASK_SCHEDULER": handle.dask_scheduler,
        "ROSE_RELAY": handle.relay,
        "ROSE_RUN_DIR": str(handle.run_dir),
        **({SUPERVISOR_ENV: str(handle.supervisor.pid)} if handle.supervisor else {}),
        "ROSE_DATA_DIR": str(data_dir()),
    }
    if handle.relay == "mooncake" and handle.mooncake_master and handle.mooncake_metadata_url:
        env.update(mooncake_env(MooncakeServices(handle.mooncake_master,
                                                 handle.mooncake_metadata_url,
                                                 client_addr=handle.mooncake_client)))
    return env


def apply_env(env: dict[str, str]) -> None:
    """Put a stack_env() into this process's environment (before importing prefect settings)."""
    os.environ.update(env)
