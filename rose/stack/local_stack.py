"""The local stack as one handle: Prefect server, Mooncake services, Dask scheduler and workers.

start_stack() starts what is missing and writes run_dir/stack.json (addresses + pids), so
`rose down`/`rose status` in another process find it. A Mooncake failure is not fatal: the
relay falls back to the filesystem, loudly.
"""
from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.panel import Panel

from rose.config import DaskTLS, StackConfig, data_dir
from rose.stack.dask_cluster import check_workers, start_dask, worker_specs
from rose.stack.dask_security import DaskScheduler
from rose.stack.errors import StackError
from rose.stack.mooncake import MooncakeServices, mooncake_env, start_mooncake
from rose.stack.ports import ensure_free, port_answers
from rose.stack.prefect_server import check_prefect, launch_prefect_server, prefect_env, prefect_home
from rose.stack.process import ProcessRecord, group_members, http_ok, read_records
from storage.atomic import write_atomic
from storage.weights.arena_files import sweep_dead

STACK_FILE = "stack.json"
err_console = Console(stderr=True)


@dataclass
class StackHandle:
    run_dir: Path
    prefect_api_url: str
    prefect_ui_url: str
    dask_scheduler: str
    mooncake_master: str | None
    mooncake_metadata_url: str | None
    relay: Literal["mooncake", "filesystem"]
    workers: dict[str, str]  # name -> kind (trainer/rollout/serving)
    prefect_home: str = ""
    processes: list[ProcessRecord] = field(default_factory=list)  # only what this stack started
    endpoints: dict[str, str] = field(default_factory=dict)  # serving worker -> OpenAI endpoint URL
    mooncake_client: str | None = None  # the store client every process here shares memory with
    # a cluster scheduler's TLS files (stack.dask_tls, paths as JSON), for `rose status` and flows
    dask_tls: dict[str, str] | None = None

    def to_json(self) -> str:
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        return json.dumps(d, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "StackHandle":
        d = json.loads(text)
        d["run_dir"] = Path(d["run_dir"])
        d["processes"] = [ProcessRecord(**p) for p in d.get("processes", [])]
        return cls(**d)

    def relay_dir(self) -> Path:
        return Path(self.run_dir) / "relay"

    def scheduler(self) -> DaskScheduler:
        """The stack's Dask scheduler, with the TLS files it was brought up with (files that
        have gone since fail validation here, named)."""
        return DaskScheduler(self.dask_scheduler,
                             DaskTLS.model_validate(self.dask_tls) if self.dask_tls else None)


@contextmanager
def _locked(run_dir: Path):
    """One start/stop at a time per stack directory (two `rose up` must not race)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def start_stack(cfg: StackConfig, run_dir: Path, *, prefect_port: int | None = None,
                scheduler_port: int | None = None) -> StackHandle:
    """Start (or reuse) the stack of run_dir; on any failure stop what was started, then raise."""
    run_dir = Path(run_dir).resolve()
    with _locked(run_dir):
        return _start_stack(cfg, run_dir, prefect_port, scheduler_port)


def _start_stack(cfg: StackConfig, run_dir: Path, prefect_port: int | None,
                 scheduler_port: int | None) -> StackHandle:
    running = load_stack(run_dir)
    if running is not None:
        return running
    _stop_stack(run_dir)  # leftovers of a stack that died half-way
    for port in (prefect_port, scheduler_port):  # fail before starting anything
        if port:
            ensure_free(port)
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
        base_env = {**prefect_env(api_url, home), "ROSE_RELAY": relay, "ROSE_RUN_DIR": str(run_dir),
                    **(mooncake_env(mooncake) if mooncake else {})}
        if cfg.dask_scheduler:
            scheduler = cfg.dask_scheduler
            workers = check_workers(DaskScheduler(cfg.dask_scheduler, cfg.dask_tls))
        else:
            specs = worker_specs(cfg.trainers, cfg.rollout_workers, cfg.serving_workers,
                                 device=cfg.device)
            cluster = start_dask(run_dir, specs, base_env, scheduler_port)
            started.append(cluster)
            scheduler, workers = cluster.scheduler_address, cluster.workers
        if server is not None:
            server.wait()
    except BaseException:
        for service in reversed(started):
            service.stop()
        raise
    procs = [p.record for s in started for p in _processes(s)]
    handle = StackHandle(run_dir, api_url, api_url.removesuffix("/api"), scheduler,
                         mooncake.master_addr if mooncake else None,
                         mooncake.metadata_url if mooncake else None, relay, workers,
                         str(home), procs, mooncake_client=mooncake.client_addr if mooncake else None,
                         dask_tls=cfg.dask_tls.model_dump(mode="json") if cfg.dask_tls else None)
    write_stack(handle)
    return handle


def write_stack(handle: StackHandle) -> None:
    """(Re)write the stack file atomically: a reader never sees half of it."""
    run_dir = Path(handle.run_dir)
    write_atomic(run_dir / STACK_FILE, handle.to_json())


def _processes(service) -> list:
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


def read_stack(run_dir: Path) -> StackHandle | None:
    """The stack recorded in run_dir/stack.json, alive or not."""
    try:
        return StackHandle.from_json((Path(run_dir) / STACK_FILE).read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None


def dead_parts(handle: StackHandle) -> list[str]:
    """Names of the stack's parts that do not run or do not answer."""
    dead = [f"{p.name} (pid {p.pid})" for p in handle.processes if not p.alive()]
    host, _, port = handle.dask_scheduler.split("://")[-1].rpartition(":")  # tcp:// or tls://
    if not port_answers(host, int(port)):
        dead.append(f"Dask scheduler at {handle.dask_scheduler}")
    if not http_ok(f"{handle.prefect_api_url}/health"):
        dead.append(f"Prefect server at {handle.prefect_api_url}")
    if handle.mooncake_master:
        host, _, port = handle.mooncake_master.rpartition(":")
        if not port_answers(host, int(port)):
            dead.append(f"Mooncake master at {handle.mooncake_master}")
    return list(dict.fromkeys(dead))


def load_stack(run_dir: Path) -> StackHandle | None:
    """The running stack of run_dir, or None when it is absent or any part of it is dead."""
    handle = read_stack(run_dir)
    return handle if handle is not None and not dead_parts(handle) else None


def stop_stack(run_dir: Path) -> list[str]:
    """Stop every process the stack of run_dir started; verify none is left. Returns their names."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        return []
    with _locked(run_dir):
        return _stop_stack(run_dir)


def _stop_stack(run_dir: Path) -> list[str]:
    records: dict[int, ProcessRecord] = {}
    handle = read_stack(run_dir)
    for p in handle.processes if handle else []:
        records[p.pid] = p
    for p in read_records(run_dir):  # also services of a start that failed half-way
        records.setdefault(p.pid, p)
    live = [p for p in records.values() if p.alive()]
    workers = [p for p in live if p.name.startswith("worker-")]
    others = [p for p in live if not p.name.startswith("worker-")]
    for batch in (workers, others):  # workers first, so they do not chase a dead scheduler
        if batch:
            with ThreadPoolExecutor(len(batch)) as pool:
                list(pool.map(lambda p: p.stop(grace=10), batch))
    left = [f"{p.name} (pid {p.pid})" for p in live if p.alive() or group_members(p.pid)]
    if left:
        raise StackError(f"could not stop: {', '.join(left)}")
    for p in records.values():
        (run_dir / "pids" / f"{p.name}.json").unlink(missing_ok=True)
    (run_dir / STACK_FILE).unlink(missing_ok=True)
    sweep_dead()  # a stopped trainer's snapshots in /dev/shm (coder processes) go with it
    return [p.name for p in live]


def stack_env(handle: StackHandle) -> dict[str, str]:
    """Env for the driver process (the one running flows) to use this stack."""
    env = {
        **prefect_env(handle.prefect_api_url, Path(handle.prefect_home or prefect_home(handle.run_dir))),
        "DASK_TEMPORARY_DIRECTORY": str(Path(handle.run_dir) / "dask"),
        "ROSE_DASK_SCHEDULER": handle.dask_scheduler,
        "ROSE_RELAY": handle.relay,
        "ROSE_RUN_DIR": str(handle.run_dir),
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
