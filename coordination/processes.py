"""A service's process as the stack records it: found, checked and stopped from any process.

Every service of the stack runs in its own session (process group), so stopping it takes
its children too (Nanny -> worker, prefect -> uvicorn): SIGTERM to the group, then SIGKILL
to whatever is left, members found through /proc so no orphan survives.
"""
from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class ProcessRecord:
    """What is needed to find (and stop) a service from another process, e.g. `rose down`."""

    name: str
    pid: int
    started: float  # psutil create_time: guards against a recycled pid
    log: str

    def alive(self) -> bool:
        try:
            p = psutil.Process(self.pid)
            return abs(p.create_time() - self.started) < 0.5 and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def stop(self, grace: float = 10.0) -> None:
        if self.alive():
            stop_group(self.pid, grace)


def group_members(pgid: int) -> list[psutil.Process]:
    """Live processes whose process group is `pgid` (also those re-parented to init)."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def stop_group(pid: int, grace: float = 10.0) -> None:
    """SIGTERM (and SIGCONT) the process group led by `pid`, wait `grace` s, then SIGKILL all that
    remain."""
    try:
        leader = psutil.Process(pid)
        family = {p.pid: p for p in [leader, *leader.children(recursive=True)]}
    except psutil.Error:
        family = {}
    for p in group_members(pid):
        family.setdefault(p.pid, p)
    if not family:
        return
    _signal_all(pid, family.values(), signal.SIGTERM)
    # a stopped (SIGSTOPped, frozen) process holds SIGTERM until continued: continue it now
    # rather than wait out the grace period for the SIGKILL
    _signal_all(pid, family.values(), signal.SIGCONT)
    _, alive = psutil.wait_procs(list(family.values()), timeout=grace)
    if alive or group_members(pid):
        _signal_all(pid, [*alive, *group_members(pid)], signal.SIGKILL)
        psutil.wait_procs(alive, timeout=5)


def _signal_all(pgid: int, procs, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:  # children that left the group (setsid) still get the signal
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def read_records(run_dir: Path) -> list[ProcessRecord]:
    """Pid files left under run_dir/pids (services started and not yet stopped)."""
    out = []
    for f in sorted((Path(run_dir) / "pids").glob("*.json")):
        try:
            out.append(ProcessRecord(**json.loads(f.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return out
