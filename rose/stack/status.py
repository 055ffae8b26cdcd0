"""Rich tables of a running stack: its services and its Dask workers."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rose.stack.dask_security import DaskScheduler
from rose.stack.local_stack import StackHandle
from rose.stack.process import http_ok


def worker_rows(scheduler: DaskScheduler, timeout: float = 10.0) -> list[dict]:
    """name, resources, threads, memory and tasks of each worker the scheduler knows."""
    with scheduler.client(timeout) as client:
        info = client.scheduler_info(n_workers=-1)["workers"]
    rows = []
    for addr, w in info.items():
        metrics = w.get("metrics", {})
        rows.append({"name": str(w.get("name")), "address": addr,
                     "resources": ", ".join(f"{k}={v:g}" for k, v in (w.get("resources") or {}).items()),
                     "nthreads": w.get("nthreads"), "memory_mb": metrics.get("memory", 0) >> 20,
                     "executing": metrics.get("executing", 0)})
    return sorted(rows, key=lambda r: r["name"])


def print_stack(handle: StackHandle, console: Console) -> None:
    services = Table(title=f"ROSE stack ({handle.run_dir})", title_justify="left")
    for col in ("service", "address", "pid", "state"):
        services.add_column(col)
    alive = {p.name: p for p in handle.processes}

    def row(name: str, address: str | None, proc_name: str | None) -> None:
        rec = alive.get(proc_name) if proc_name else None
        state = "external" if rec is None else ("[green]up[/]" if rec.alive() else "[red]dead[/]")
        services.add_row(name, address or "-", str(rec.pid) if rec else "-", state)

    row("Prefect UI", handle.prefect_ui_url, "prefect-server")
    row("Dask scheduler", handle.dask_scheduler, "dask-scheduler")
    if handle.relay == "mooncake":
        row("Mooncake master", handle.mooncake_master, "mooncake-master")
        row("Mooncake metadata", handle.mooncake_metadata_url, "mooncake-metadata")
        if handle.mooncake_client:
            row("Mooncake store client", handle.mooncake_client, "mooncake-store-client")
    else:
        services.add_row("relay", str(handle.relay_dir()), "-", "[yellow]filesystem[/]")
    for name, url in sorted(handle.endpoints.items()):
        services.add_row(f"serving endpoint ({name})", url, "-",
                         "[green]up[/]" if http_ok(f"{url}/health") else "[red]down[/]")
    console.print(services)

    workers = Table(title="Dask workers (each stands for one GPU)", title_justify="left")
    for col in ("worker", "kind", "resources", "threads", "memory MB", "executing", "pid"):
        workers.add_column(col, no_wrap=True)
    try:
        rows = {r["name"]: r for r in worker_rows(handle.scheduler())}
    except (OSError, TimeoutError):  # scheduler down: show what stack.json recorded
        rows = {}
    for name in sorted(set(handle.workers) | set(rows)):
        r, rec = rows.get(name), alive.get(f"worker-{name}")
        if r is None:
            workers.add_row(name, handle.workers.get(name, "?"), "-", "-", "-", "-",
                            "[red]not registered[/]")
            continue
        workers.add_row(name, handle.workers.get(name, "?"), r["resources"], str(r["nthreads"]),
                        str(r["memory_mb"]), str(r["executing"]), str(rec.pid) if rec else "-")
    console.print(workers)
