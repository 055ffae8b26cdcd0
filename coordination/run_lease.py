"""The run lease: one driver per run. A second `rose train` / `rose resume` / deployment run on a
run that is being driven is refused with the holder named; a holder that is provably dead is
taken over.

The lease is `<run dir>/driver.json` (written with storage.atomic), read and changed only under
an flock on `<run dir>/driver.lock`, held for the few milliseconds of a decision (the kernel
drops it if the process dies there). The holder renews the lease every `ttl_s / 4` seconds from
a daemon thread. It is released on a normal exit or an exception (the context manager), and on
SIGTERM when nothing else handles it. A holder counts as dead only when that is provable: on this
host its pid is gone (or recycled: the process start time is recorded); on another host (a shared
data directory, docs/cluster.md) its lease was not renewed for `ttl_s`. A live holder on this
host is never taken over, renewed or not: a stopped or stuck driver could wake up and go on.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from coordination.errors import StackError
from coordination.processes import ProcessRecord
from storage.atomic import write_atomic

LEASE_FILE = "driver.json"
LOCK_FILE = "driver.lock"
LEASE_TTL_S = 60.0  # another host's driver is dead once its lease is this old
log = logging.getLogger(__name__)


class RunLeaseHeld(StackError):
    """Another live driver holds the run: the message names it (one line for the CLI)."""


@dataclass(frozen=True)
class Holder:
    run: str
    pid: int
    host: str
    started: float  # the process's psutil create_time: a recycled pid is not the holder
    since: float  # unix time the lease was taken
    renewed: float  # unix time of the last renewal
    ttl_s: float
    command: str
    token: str  # this holding (a process can take, release and take again)

    def dead(self, now: float | None = None) -> str | None:
        """Why this holder is provably dead, or None when it may still be driving."""
        if self.host == socket.gethostname():
            alive = ProcessRecord("driver", self.pid, self.started, "").alive()
            return None if alive else f"pid {self.pid} is gone on {self.host}"
        age = (now or time.time()) - self.renewed
        return f"not renewed for {age:.0f} s (deadline {self.ttl_s:.0f} s)" if age > self.ttl_s else None

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        return (f"pid {self.pid} on {self.host}, since {since} "
                f"({time.time() - self.since:.0f} s ago, renewed {time.time() - self.renewed:.0f} s "
                f"ago), command `{self.command}`")


def read_holder(run_dir: Path) -> Holder | None:
    """The lease's holder as written, or None when no lease (or an unreadable one) is there."""
    try:
        return Holder(**json.loads((run_dir / LEASE_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as e:  # not ours or hand-edited: never blocks a run
        log.warning("ignoring unreadable run lease %s: %s", run_dir / LEASE_FILE, e)
        return None


@contextmanager
def locked(run_dir: Path, timeout_s: float = 30.0, lock_file: str = LOCK_FILE) -> Iterator[None]:
    """A lease's short critical section (read, decide, write), across processes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{run_dir / lock_file} stayed locked {timeout_s:.0f} s") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def driver_command() -> str:
    """This process's command line as a user would recognise it: `rose train --steps 5`,
    `python -m rose.cli resume r1`, plus the Prefect flow run a deployment's process runs."""
    script = Path(sys.argv[0]).name
    if script in ("", "-c", "-m", "cli.py", "__main__.py"):
        cmd = " ".join([Path(sys.orig_argv[0]).name, *sys.orig_argv[1:]])
    else:
        cmd = " ".join([script, *sys.argv[1:]])
    flow_run = os.environ.get("PREFECT__FLOW_RUN_ID")
    cmd = cmd if len(cmd) <= 200 else cmd[:197] + "..."
    return f"{cmd} (Prefect flow run {flow_run})" if flow_run else cmd


def _process_start(pid: int) -> float:
    return psutil.Process(pid).create_time()


class RunLease:
    """One holding of a run's lease by this process (see the module docstring)."""

    def __init__(self, run_dir: Path, run_id: str, command: str | None = None,
                 ttl_s: float = LEASE_TTL_S) -> None:
        self.run_dir, self.run_id, self.ttl_s = Path(run_dir), run_id, ttl_s
        self.command = command or driver_command()
        self.holder: Holder | None = None
        self.lost: str | None = None  # set when the lease is found taken from us
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> Holder:
        """Take the lease, or raise RunLeaseHeld naming the live holder."""
        now, pid = time.time(), os.getpid()
        mine = Holder(self.run_id, pid, socket.gethostname(), _process_start(pid), now, now,
                      self.ttl_s, self.command, uuid.uuid4().hex)
        with locked(self.run_dir):
            other = read_holder(self.run_dir)
            if other is not None:
                why_dead = other.dead(now)
                if why_dead is None:
                    raise RunLeaseHeld(f"run {self.run_id} is being driven by another driver: "
                                       f"{other.describe()}. Wait for it to end or stop it; a "
                                       "driver that is gone is taken over automatically")
                log.warning("run %s: taking over the lease of a dead driver (%s; %s)",
                            self.run_id, why_dead, other.describe())
            write_atomic(self.run_dir / LEASE_FILE, json.dumps(asdict(mine), indent=1))
        self.holder, self.lost = mine, None
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                        name=f"run-lease-{self.run_id}")
        self._thread.start()
        return mine

    def renew(self) -> bool:
        """Write a fresh renewal time; False (and `lost` set) when the lease is no longer ours."""
        if self.holder is None:
            return False
        with locked(self.run_dir):
            current = read_holder(self.run_dir)
            if current is None or current.token != self.holder.token:
                self.lost = ("the lease file is gone" if current is None
                             else f"taken over by {current.describe()}")
                return False
            self.holder = Holder(**{**asdict(self.holder), "renewed": time.time()})
            write_atomic(self.run_dir / LEASE_FILE, json.dumps(asdict(self.holder), indent=1))
        return True

    def release(self, lock_timeout_s: float = 30.0) -> None:
        """Remove the lease if it is still ours (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        held, self.holder = self.holder, None
        if held is None:
            return
        try:
            with locked(self.run_dir, lock_timeout_s):
                self._remove_if_mine(held)
        except TimeoutError:  # a SIGTERM landed inside our own critical section
            self._remove_if_mine(held)

    def check(self) -> None:
        """Raise if another driver took the lease from us (our renewals stopped past the deadline,
        seen from another host): this driver must not start another step."""
        if self.lost:
            raise RunLeaseHeld(f"run {self.run_id}: this driver lost its lease ({self.lost})")

    def _remove_if_mine(self, held: Holder) -> None:
        current = read_holder(self.run_dir)
        if current is not None and current.token == held.token:
            (self.run_dir / LEASE_FILE).unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                if not self.renew():
                    log.error("run %s: this driver lost its lease (%s)", self.run_id, self.lost)
                    return
            except Exception as e:  # a slow shared filesystem: try again at the next beat
                log.warning("run %s: renewing the lease failed: %s", self.run_id, e)


_held: dict[Path, tuple[RunLease, int]] = {}  # this process's leases: nested holds re-enter
_held_lock = threading.Lock()


@contextmanager
def driving(run_dir: Path, run_id: str, command: str | None = None,
            ttl_s: float = LEASE_TTL_S) -> Iterator[RunLease]:
    """Hold the run's lease for the block. Re-entrant within a process (`rose train` takes it
    before building models and starting the stack, the train flow it runs takes it again)."""
    key = Path(run_dir).resolve()
    with _held_lock:
        entry = _held.get(key)
        if entry is not None:
            _held[key] = (entry[0], entry[1] + 1)
    if entry is not None:
        try:
            yield entry[0]
        finally:
            with _held_lock:
                lease, n = _held[key]
                _held[key] = (lease, n - 1)
        return
    lease = RunLease(key, run_id, command, ttl_s)
    lease.acquire()
    with _held_lock:
        _held[key] = (lease, 1)
    restore = _release_on_sigterm(lease)
    try:
        yield lease
    finally:
        restore()
        with _held_lock:
            _held.pop(key, None)
        lease.release()


def _release_on_sigterm(lease: RunLease):
    """SIGTERM kills a Python process without running `finally`: when nothing else handles it
    (a plain `rose train`), release the lease first, then die of the signal as before. Prefect's
    flow-run processes raise on SIGTERM instead, which unwinds through `driving` anyway."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None

    def on_term(signum, frame):
        lease.release(lock_timeout_s=1.0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is on_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return restore
