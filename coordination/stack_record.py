"""The running stack as its record says: run_dir/stack.json (addresses, pids, the supervisor's
view of each service), read by every process that uses the stack, and whether its parts are
alive. rose/stack/local_stack.py starts and stops the stack and writes the record.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from coordination.dask_security import DaskScheduler
from coordination.probes import http_ok, port_answers
from coordination.processes import ProcessRecord
from core.config import DaskTLS

STACK_FILE = "stack.json"


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
    # the supervisor (rose/stack/supervisor.py) and what it keeps here: per service its state
    # (up, starting, restarting, failed), restarts, last exit code and log; every restart
    supervisor: ProcessRecord | None = None
    services: dict[str, dict] = field(default_factory=dict)
    restarts: list[dict] = field(default_factory=list)  # {at, service, exit_code, restart, pid}

    def to_json(self) -> str:
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        return json.dumps(d, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "StackHandle":
        d = json.loads(text)
        d["run_dir"] = Path(d["run_dir"])
        d["processes"] = [ProcessRecord(**p) for p in d.get("processes", [])]
        if d.get("supervisor"):
            d["supervisor"] = ProcessRecord(**d["supervisor"])
        return cls(**d)

    def supervised(self) -> dict[str, dict]:
        """The supervisor's view of each service, {} when no live supervisor keeps one."""
        return self.services if self.supervisor is not None and self.supervisor.alive() else {}

    def state(self, service: str) -> str | None:
        """up, starting (restarted, not answering yet), restarting (waiting out its backoff),
        failed (given up on); None: not supervised."""
        return self.supervised().get(service, {}).get("state")

    def relay_dir(self) -> Path:
        return Path(self.run_dir) / "relay"

    def scheduler(self) -> DaskScheduler:
        """The stack's Dask scheduler, with the TLS files it was brought up with (files that
        have gone since fail validation here, named)."""
        return DaskScheduler(self.dask_scheduler,
                             DaskTLS.model_validate(self.dask_tls) if self.dask_tls else None)


def read_stack(run_dir: Path) -> StackHandle | None:
    """The stack recorded in run_dir/stack.json, alive or not."""
    try:
        return StackHandle.from_json((Path(run_dir) / STACK_FILE).read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None


# which service answers at each address the stack records
OWNERS = {"dask": "dask-scheduler", "prefect": "prefect-server", "master": "mooncake-master"}
RECOVERING = ("restarting", "starting")
RECOVERY_WAIT_S = 120.0  # how long load_stack waits for a service the supervisor restarts


def dead_parts(handle: StackHandle) -> list[str]:
    """Names of the stack's parts that do not run or do not answer. A service its supervisor
    is restarting is not dead (recovering_parts); one it gave up on is, with why."""
    dead = []
    if handle.supervisor is not None and not handle.supervisor.alive():
        dead.append(f"stack supervisor (pid {handle.supervisor.pid}): nothing restarts a "
                    "service that exits")
    for p in handle.processes:
        state = handle.state(p.name)
        if state == "failed":
            s = handle.services[p.name]
            dead.append(f"{p.name} failed ({s.get('why', 'gave up restarting it')}; last exit "
                        f"code {s.get('last_exit')}; log: {s.get('log', p.log)})")
        elif state not in RECOVERING and not p.alive():
            dead.append(f"{p.name} (pid {p.pid})")
    quiet = {OWNERS[k] for k in OWNERS if handle.state(OWNERS[k]) in (*RECOVERING, "failed")}
    host, _, port = handle.dask_scheduler.split("://")[-1].rpartition(":")  # tcp:// or tls://
    if OWNERS["dask"] not in quiet and not port_answers(host, int(port)):
        dead.append(f"Dask scheduler at {handle.dask_scheduler}")
    if OWNERS["prefect"] not in quiet and not http_ok(f"{handle.prefect_api_url}/health"):
        dead.append(f"Prefect server at {handle.prefect_api_url}")
    if handle.mooncake_master and OWNERS["master"] not in quiet:
        host, _, port = handle.mooncake_master.rpartition(":")
        if not port_answers(host, int(port)):
            dead.append(f"Mooncake master at {handle.mooncake_master}")
    return list(dict.fromkeys(dead))


def recovering_parts(handle: StackHandle) -> list[str]:
    """Services the live supervisor is restarting (waiting out a backoff, or started again and
    not answering yet)."""
    return [f"{name} ({s['state']})" for name, s in handle.supervised().items()
            if s.get("state") in RECOVERING]


def load_stack(run_dir: Path, recovery_wait_s: float = RECOVERY_WAIT_S) -> StackHandle | None:
    """The running stack of run_dir, or None when it is absent or any part of it is dead. A
    part its supervisor is restarting is waited for, up to `recovery_wait_s`."""
    deadline = time.monotonic() + recovery_wait_s
    while True:
        handle = read_stack(run_dir)
        if handle is None or dead_parts(handle):
            return None
        if not recovering_parts(handle):
            return handle
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)
