"""The stack's supervisor: one long-lived process, the parent of every service `rose up` starts.

`rose up` (start_stack, through rose/stack/supervisor_launch.py) runs `python -m
rose.stack.supervisor <run dir>` in a session of its own, so it outlives the command; it starts
the services (local_stack.start_services), says over a pipe whether they came up (with the
error, when not), and from then on watches them: a service that exits unasked (a SIGKILL, a
crash) is restarted with the same command line and environment (the same ports, so the same
addresses: a serving worker's endpoint keeps its URL), after a capped exponential backoff
(RestartPolicy). Each restart is recorded (time, service, exit code, restart count) in the
stack file and in logs/supervisor.log, and `rose status` shows them. A service that exits
`max_exits` times within `window_s` is marked failed, said in the log and the stack file
(`rose status` names it, with its last exit code and log), and never restarted again; the rest
of the stack keeps running. The one service no restart in place can mend, the Mooncake store
client (NEVER_RESTART), is marked failed at its first exit.

Plain standard library and psutil: the supervisor is the services' parent (Popen), so their
exit codes are its own to read. SIGTERM (`rose down`) stops it from restarting anything at
once (the flag is read before every restart, in the one loop that restarts), then it stops
the services, workers first, and exits last.
"""
from __future__ import annotations

import io
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from coordination.errors import StackError
from coordination.probes import http_ok, port_answers
from coordination.processes import ProcessRecord, group_members
from rose.stack.process import ManagedProcess
from rose.stack.supervisor_launch import LOG, RECORD
from storage.atomic import write_atomic

TICK_S = 0.2
RESTARTS_KEPT = 200  # restart records kept in the stack file (the log keeps all)


@dataclass
class RestartPolicy:
    """When to restart a service that exited, and when to give up on it. Plain Python: the
    caller passes the time. `exited(now)` records an exit and returns the seconds to wait
    before the restart (base_s, doubling with each exit still inside the window, at most
    cap_s), or None: it exited `max_exits` times within `window_s`, give up."""

    base_s: float = 0.5
    cap_s: float = 30.0
    max_exits: int = 5
    window_s: float = 60.0
    exits: list[float] = field(default_factory=list)  # times of the exits inside the window

    def exited(self, now: float) -> float | None:
        self.exits = [t for t in self.exits if now - t < self.window_s] + [now]
        if len(self.exits) >= self.max_exits:
            return None
        return min(self.cap_s, self.base_s * 2 ** (len(self.exits) - 1))

    def why_failed(self) -> str:
        return f"exited {len(self.exits)} times within {self.window_s:g} s"


@dataclass
class Service:
    proc: ManagedProcess
    probe: object = None  # () -> bool: answers at its address (None: running is enough)
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    state: str = "up"  # up | starting | restarting | failed
    restarts: int = 0
    last_exit: int | None = None
    restart_at: float = 0.0  # monotonic
    since: float = field(default_factory=time.time)
    why: str = ""
    never_restart: str = ""  # why a restart in place would not mend it: failed at its first exit

    @property
    def name(self) -> str:
        return self.proc.name

    def view(self) -> dict:
        """What the stack file keeps of it (read by `rose status` and dead_parts)."""
        return {"state": self.state, "restarts": self.restarts, "last_exit": self.last_exit,
                "since": self.since, "log": str(self.proc.log_path),
                **({"why": self.why} if self.why else {}),
                **({"restart_in_s": round(max(0.0, self.restart_at - time.monotonic()), 1)}
                   if self.state == "restarting" else {})}


# Services a restart in place does not mend. The Mooncake store client held every published
# version in its segment, and each process's relay client of it keeps memory it shared with
# the dead one: against a restarted store client their puts fail (-600 INVALID_PARAMS, still
# after 20 s here), so the workers' relays would stay broken behind a stack that looks whole.
# Failed at once instead: the run's relay ops fail naming it, and `rose up` / `rose resume`
# start a new stack (chaos row 5b).
NEVER_RESTART = {"mooncake-store-client": "exited: its clients (every worker's relay) cannot "
                 "use a new one, so it is not restarted in place"}


def probe_for(name: str, handle) -> object:
    """How to tell that a restarted service answers again, from the addresses the stack records."""
    def port_of(address: str):
        host, _, port = address.split("://")[-1].split("/")[0].rpartition(":")
        return lambda: port_answers(host, int(port))

    if name == "prefect-server":
        return lambda: http_ok(f"{handle.prefect_api_url}/health")
    if name == "dask-scheduler":
        return port_of(handle.dask_scheduler)
    if name == "mooncake-master" and handle.mooncake_master:
        return port_of(handle.mooncake_master)
    if name == "mooncake-metadata" and handle.mooncake_metadata_url:
        return port_of(handle.mooncake_metadata_url)
    if name == "mooncake-store-client" and handle.mooncake_client:
        return port_of(handle.mooncake_client)
    return None  # a Dask worker: it registers (and its plugins start) on its own


class Supervisor:
    def __init__(self, run_dir: Path, services: list[Service], log=None) -> None:
        self.run_dir, self.services = Path(run_dir), services
        self.log = log or sys.stderr
        self.stopping = False
        self.restarts: list[dict] = []

    def ask_stop(self, *_) -> None:
        """SIGTERM: no restart from now on (read by the loop before each one)."""
        self.stopping = True

    def say(self, text: str) -> None:
        self.log.write(f"{time.strftime('%F %T')} {text}\n")
        self.log.flush()

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        while not self.stopping:
            try:
                self.tick(time.monotonic())
            except Exception as e:  # noqa: BLE001 - the one parent of the stack must not die
                self.say(f"supervisor error (it goes on): {type(e).__name__}: {e}")
            time.sleep(TICK_S)
        self.say("stopping: no more restarts; stopping the services")
        self.stop_all()
        self.say("stopped")

    def tick(self, now: float) -> None:
        changed = False
        for svc in self.services:
            if self.stopping:
                return
            if svc.state in ("up", "starting") and not svc.proc.running():
                self.exited(svc, now)
                changed = True
            elif svc.state == "restarting" and now >= svc.restart_at:
                self.restart(svc)
                changed = True
            elif svc.state == "starting" and (svc.probe is None or svc.probe()):
                svc.state, svc.since = "up", time.time()
                self.say(f"{svc.name} {'answers' if svc.probe else 'runs'} again "
                         f"(restart {svc.restarts})")
                changed = True
        if changed:
            self.save()

    def exited(self, svc: Service, now: float) -> None:
        code = svc.proc.popen.returncode if svc.proc.popen is not None else None
        pid = svc.proc.popen.pid if svc.proc.popen is not None else None
        if pid is not None:  # what it left in its group (a nanny's worker) holds its ports
            _stop_leftovers(pid)
        svc.last_exit, svc.since = code, time.time()
        delay = None if svc.never_restart else svc.policy.exited(now)
        if delay is None:
            svc.state, svc.why = "failed", svc.never_restart or svc.policy.why_failed()
            self.say(f"FAILED: {svc.name} {svc.why} (last exit code {code}); not restarted "
                     f"again; the rest of the stack keeps running. Its log: {svc.proc.log_path}")
            return
        svc.state, svc.restart_at = "restarting", now + delay
        self.say(f"{svc.name} (pid {pid}) exited with code {code}: restart in {delay:g} s")

    def restart(self, svc: Service) -> None:
        if self.stopping:  # never start what `rose down` is about to stop
            return
        try:
            svc.proc.start()
        except StackError as e:  # its executable is gone: an exit like any other
            self.say(f"{svc.name} could not start: {e}")
            svc.proc.popen = None
            self.exited(svc, time.monotonic())
            return
        svc.restarts += 1
        svc.state, svc.since = "starting", time.time()
        record = {"at": time.time(), "service": svc.name, "exit_code": svc.last_exit,
                  "restart": svc.restarts, "pid": svc.proc.pid}
        self.restarts.append(record)
        self.say(f"restarted {svc.name}: restart {svc.restarts}, pid {svc.proc.pid} (it had "
                 f"exited with code {svc.last_exit})")

    def save(self) -> None:
        from rose.stack.local_stack import update_stack

        records = {s.name: s.proc.record for s in self.services if s.proc.record is not None}
        views = {s.name: s.view() for s in self.services}
        restarts = self.restarts[-RESTARTS_KEPT:]

        def change(handle) -> None:
            handle.processes = [records.get(p.name, p) for p in handle.processes]
            handle.services, handle.restarts = views, restarts

        update_stack(self.run_dir, change)

    def stop_all(self) -> None:
        """Workers first, all at once (each waits its own grace), then the other services."""
        procs = [s.proc for s in self.services]
        workers = [p for p in procs if p.name.startswith("worker-")]
        others = [p for p in procs if not p.name.startswith("worker-")]
        for batch in (workers, others):
            if batch:
                with ThreadPoolExecutor(len(batch)) as pool:
                    list(pool.map(lambda p: p.stop(grace=10), batch))


def _stop_leftovers(pgid: int, grace: float = 0.5) -> None:
    """SIGTERM, then SIGKILL, what is left in the process group of a service that exited (its
    leader is reaped: only the group's members are signalled, never a pid that may be reused)."""
    members = group_members(pgid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in members:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        _, members = psutil.wait_procs(members, timeout=grace if sig == signal.SIGTERM else 5)
        if not members:
            return


# ---- the supervisor process ------------------------------------------------------------------
class _StartAborted(BaseException):
    """SIGTERM while the services start: stop what was started, then exit."""


def _abort_start(*_) -> None:
    raise _StartAborted()


def main() -> None:
    from rich.console import Console

    from core.config import StackConfig
    from rose.stack import local_stack

    run_dir = Path(sys.argv[1]).resolve()
    request = json.loads(sys.stdin.read())
    ready = os.fdopen(request["ready_fd"], "w")
    signal.signal(signal.SIGTERM, _abort_start)
    signal.signal(signal.SIGINT, _abort_start)
    said = io.StringIO()
    local_stack.err_console = Console(file=said, width=100,
                                      force_terminal=bool(request.get("color")))
    log = sys.stdout
    print(f"{time.strftime('%F %T')} supervisor pid {os.getpid()}: starting the stack in "
          f"{run_dir}", file=log, flush=True)
    procs: list[ManagedProcess] = []
    try:
        cfg = StackConfig.model_validate(request["config"])
        handle, procs = local_stack.start_services(cfg, run_dir, request["prefect_port"],
                                                   request["scheduler_port"])
        services = [Service(p, probe_for(p.name, handle), never_restart=NEVER_RESTART.get(p.name, ""))
                    for p in procs]
        supervisor = Supervisor(run_dir, services, log)
        if services:
            me = psutil.Process()
            handle.supervisor = ProcessRecord("supervisor", me.pid, me.create_time(),
                                              str(run_dir / "logs" / LOG))
            handle.services = {s.name: s.view() for s in services}
            write_atomic(run_dir / RECORD, json.dumps(asdict(handle.supervisor)))
        local_stack.write_stack(handle)
        # from here SIGTERM (`rose down`) is an order to stop, read by the loop
        signal.signal(signal.SIGTERM, supervisor.ask_stop)
        signal.signal(signal.SIGINT, supervisor.ask_stop)
    except BaseException as e:  # noqa: BLE001 - said to `rose up`, which raises it
        for p in reversed(procs):  # started, then aborted before the stack file was whole
            p.stop(grace=3)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"{time.strftime('%F %T')} the stack did not start: {type(e).__name__}: {msg}",
              file=log, flush=True)
        ready.write(json.dumps({"error": msg or repr(e), "type": type(e).__name__,
                                "detail": getattr(e, "detail", ""), "said": said.getvalue()}))
        ready.close()
        sys.exit(1)
    try:
        ready.write(json.dumps({"ok": True, "said": said.getvalue()}))
        ready.close()
    except BrokenPipeError:  # `rose up` is gone (it stops us if it was interrupted): supervise
        pass
    if not services:  # nothing of ours to watch (a cluster's addresses, no Mooncake)
        return
    supervisor.say(f"supervising {', '.join(s.name for s in services)}")
    supervisor.run()


if __name__ == "__main__":
    main()
