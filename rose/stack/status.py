"""Rich tables of a running stack: its services, its Dask workers (a serving worker's rollout
engine: parked or up, and the run it is lent to), its co-execution groups, and what its supervisor
restarted (or gave up on)."""
from __future__ import annotations

import time

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from coordination.coexec_groups import CoexecGroups
from coordination.dask_security import DaskScheduler
from coordination.probes import http_ok
from coordination.stack_record import StackHandle
from coordination.serving_leases import ServingLeases


def worker_rows(scheduler: DaskScheduler, timeout: float = 10.0, lent: dict[str, str] | None = None) -> list[dict]:
    """name, resources, threads, memory and tasks of each worker the scheduler knows, and its
    rollout engine (`lent`: serving worker -> the run whose lease holds it)."""
    lent = lent or {}
    with scheduler.client(timeout) as client:
        info = client.scheduler_info(n_workers=-1)["workers"]
        parking = park_states(client)
    rows = []
    for addr, w in info.items():
        metrics = w.get("metrics", {})
        rows.append({"name": str(w.get("name")), "address": addr,
                     "resources": ", ".join(f"{k}={v:g}" for k, v in (w.get("resources") or {}).items()),
                     "nthreads": w.get("nthreads"), "memory_mb": metrics.get("memory", 0) >> 20,
                     "executing": metrics.get("executing", 0),
                     "rollout": rollout_cell(parking.get(addr), lent.get(str(w.get("name"))))})
    return sorted(rows, key=lambda r: r["name"])


def park_states(client) -> dict:
    """Worker address -> its rollout engine's park state (None: no co-serving executor)."""
    from executors.coserving.plugin import serving_park_state

    try:
        return client.run(serving_park_state, on_error="return")
    except Exception:  # noqa: BLE001 - the table shows the rest without it
        return {}


def rollout_cell(park, lent_to: str | None = None) -> str:
    """A serving worker's rollout engine: parked (what it gave back) or up (its last wake), and the
    run its lease lends it to."""
    if not isinstance(park, dict):
        return "-"
    lent = f", lent to run {lent_to}" if lent_to else ""
    back = f"gave back {park['pages_given_back']} pages, {park['bytes_given_back'] / 2**20:.0f} MiB"
    if park["parked"]:
        return f"[yellow]parked[/]{lent} ({back})"
    return "up" + lent + (f" (woke in {park['wake_s']:.1f} s)" if park["wake_s"] is not None else "")


def coexec_table(groups: dict[str, dict]) -> Table | None:
    """The co-execution groups (CoexecGroups.pools): their runs, and per pool the run holding its
    permit or, free, whose turn is next. None: no group."""
    if not groups:
        return None
    table = Table(title="Co-execution groups (Prefect limits rose-group-NAME-POOL)", title_justify="left")
    for col in ("group", "runs", "rollout pool", "train pool"):
        table.add_column(col)

    def pool_cell(pool: dict) -> str:
        if pool["held_by"]:
            return f"[green]{pool['held_by']}[/]"
        return f"free, {pool['next']}'s turn" if pool["next"] else "free"
    for name, group in sorted(groups.items()):
        table.add_row(name, ", ".join(group["runs"]), pool_cell(group["pools"]["rollout"]),
                      pool_cell(group["pools"]["train"]))
    return table


def state_cell(handle: StackHandle, name: str, rec) -> str:
    """A service's state as its supervisor sees it (up, restarting in N s, starting, FAILED),
    else by its pid (up/dead); "external" where the stack did not start it."""
    if rec is None:
        return "external"
    seen = handle.supervised().get(name)
    if seen is None:
        return "[green]up[/]" if rec.alive() else "[red]dead[/]"
    state = seen.get("state")
    if state == "failed":
        return f"[bold red]FAILED[/] (exit {seen.get('last_exit')})"
    if state == "restarting":
        return f"[yellow]restarting[/] (exit {seen.get('last_exit')}, in {seen.get('restart_in_s', 0):g} s)"
    if state == "starting":
        return "[yellow]starting[/]"
    return "[green]up[/]" if rec.alive() else "[red]dead[/]"


def restarts_cell(handle: StackHandle, name: str) -> str:
    n = handle.supervised().get(name, {}).get("restarts", 0)
    return str(n) if n else "-"


def reward_pool_cell(run_dir) -> str:
    """The reward pool's workers up now of its cap, and its last scale-up's delay."""
    from coordination.reward_pool_state import read_pool_state

    state = read_pool_state(run_dir)
    if state is None:
        return "starting"
    up = sum(1 for spans in state["workers"].values() if spans and spans[-1][1] is None)
    last = state["scale_ups"][-1] if state["scale_ups"] else None
    delay = f", last scale-up {last[1] - last[0]:.1f} s" if last else ""
    return f"{up} of at most {state['policy']['max_workers']} reward workers up{delay}"


def print_stack(handle: StackHandle, console: Console) -> None:
    services = Table(title=f"ROSE stack ({handle.run_dir})", title_justify="left")
    for col in ("service", "address", "pid", "state", "restarts"):
        services.add_column(col)
    alive = {p.name: p for p in handle.processes}

    def row(name: str, address: str | None, proc_name: str | None) -> None:
        rec = alive.get(proc_name) if proc_name else None
        services.add_row(name, address or "-", str(rec.pid) if rec else "-",
                         state_cell(handle, proc_name, rec), restarts_cell(handle, proc_name))

    row("Prefect UI", handle.prefect_ui_url, "prefect-server")
    row("Dask scheduler", handle.dask_scheduler, "dask-scheduler")
    if handle.relay == "mooncake":
        row("Mooncake master", handle.mooncake_master, "mooncake-master")
        row("Mooncake metadata", handle.mooncake_metadata_url, "mooncake-metadata")
        if handle.mooncake_client:
            row("Mooncake store client", handle.mooncake_client, "mooncake-store-client")
    else:
        services.add_row("relay", str(handle.relay_dir()), "-", "[yellow]filesystem[/]", "-")
    if "reward-pool" in alive:  # the elastic reward pool (rose/stack/reward_pool.py): its workers come and go
        row("reward pool", reward_pool_cell(handle.run_dir), "reward-pool")
    for name, url in sorted(handle.endpoints.items()):
        services.add_row(f"serving endpoint ({name})", url, "-",
                         "[green]up[/]" if http_ok(f"{url}/health") else "[red]down[/]", "-")
    sup = handle.supervisor
    if sup is not None:
        services.add_row("supervisor", f"log {sup.log}", str(sup.pid),
                         "[green]up[/]" if sup.alive() else "[bold red]dead[/] (nothing restarts)",
                         "-")
    console.print(services)

    workers = Table(title="Dask workers (each stands for one GPU)", title_justify="left")
    for col in ("worker", "kind", "resources", "threads", "memory MB", "executing", "rollout engine",
                "pid", "restarts"):
        workers.add_column(col, no_wrap=True)
    try:
        rows = {r["name"]: r for r in worker_rows(handle.scheduler(), lent=ServingLeases(handle.run_dir).holders())}
    except (OSError, TimeoutError):  # scheduler down: show what stack.json recorded
        rows = {}
    for name in sorted(set(handle.workers) | set(rows)):
        r, rec = rows.get(name), alive.get(f"worker-{name}")
        restarts = restarts_cell(handle, f"worker-{name}")
        if r is None:
            state = handle.state(f"worker-{name}")
            why = {"failed": "[bold red]FAILED[/]", "restarting": "[yellow]restarting[/]",
                   "starting": "[yellow]registering[/]"}.get(state, "[red]not registered[/]")
            workers.add_row(name, handle.workers.get(name, "?"), "-", "-", "-", "-", "-", why, restarts)
            continue
        workers.add_row(name, handle.workers.get(name, "?"), r["resources"], str(r["nthreads"]),
                        str(r["memory_mb"]), str(r["executing"]), r["rollout"], str(rec.pid) if rec else "-",
                        restarts)
    console.print(workers)
    groups = coexec_table(CoexecGroups(handle.run_dir).pools())
    if groups is not None:
        console.print(groups)
    print_restarts(handle, console)


def print_restarts(handle: StackHandle, console: Console, last: int = 10) -> None:
    """The supervisor's last restarts, and every service it gave up on, loudly."""
    if handle.restarts:
        table = Table(title=f"Restarts by the supervisor (last {min(last, len(handle.restarts))} "
                      f"of {len(handle.restarts)})", title_justify="left",
                      caption=f"log: {handle.supervisor.log}" if handle.supervisor else None,
                      caption_justify="left")
        for col in ("time", "service", "exit code", "restart"):
            table.add_column(col)
        for r in handle.restarts[-last:]:
            table.add_row(time.strftime("%F %T", time.localtime(r["at"])), r["service"],
                          str(r.get("exit_code")), str(r.get("restart")))
        console.print(table)
    failed = {n: s for n, s in handle.supervised().items() if s.get("state") == "failed"}
    for name, s in failed.items():
        console.print(Panel(
            f"[bold]{name}[/] {s.get('why', '')}; the supervisor does not restart it again.\n"
            f"last exit code {s.get('last_exit')}; its log: {s.get('log')}\n"
            "The rest of the stack keeps running; `rose down` then `rose up` starts it afresh.",
            title=f"FAILED: {name}", border_style="bold red"))
