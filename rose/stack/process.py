"""A managed subprocess: own process group, log file and pid file under the run directory.

Every service of the stack runs in its own session (process group), so stopping it takes
its children too; the record it leaves and how a group is stopped from any process are
coordination/processes.py's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil

from coordination.errors import StackError
from coordination.probes import http_ok, port_answers
from coordination.processes import ProcessRecord, stop_group
from storage.atomic import write_atomic


class ManagedProcess:
    """One service of the stack. start() -> wait_for_port()/wait_for_http() -> stop()."""

    def __init__(self, name: str, argv: list[str], run_dir: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None, nice: int = 0,
                 new_session: bool = True):
        self.name, self.argv, self.cwd, self.nice = name, [str(a) for a in argv], cwd, nice
        self.new_session = new_session  # False: a member of the starting service's group
        self.env = {**os.environ, **(env or {})}
        self.log_path = Path(run_dir) / "logs" / f"{name}.log"
        self.pid_path = Path(run_dir) / "pids" / f"{name}.json"
        self.popen: subprocess.Popen | None = None
        self.record: ProcessRecord | None = None

    def start(self) -> "ManagedProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%F %T')} {' '.join(self.argv)}\n".encode())
            log.flush()
            # niced through nice(1), not a preexec_fn: the stack's supervisor, which starts and
            # restarts the services, has threads (Dask's client, Mooncake's), and Python code
            # run between fork and exec in a threaded process may deadlock
            nice = [shutil.which("nice") or "nice", "-n", str(self.nice)] if self.nice else []
            try:
                self.popen = subprocess.Popen(
                    [*nice, *self.argv], stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                    start_new_session=self.new_session)
            except FileNotFoundError:
                raise StackError(f"{self.name}: executable not found: {self.argv[0]}") from None
        try:
            started = psutil.Process(self.popen.pid).create_time()
        except psutil.Error:
            started = time.time()
        self.record = ProcessRecord(self.name, self.popen.pid, started, str(self.log_path))
        write_atomic(self.pid_path, json.dumps(asdict(self.record)))
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def fail(self, what: str) -> StackError:
        """Stop the process and build the one-line error: what went wrong, its last log line."""
        last = next((ln.strip() for ln in reversed(self.log_tail(40).splitlines())
                     if ln.strip() and not ln.startswith("====")), "")
        hint = f": {last[:200]}" if last else ""
        err = StackError(f"{self.name} {what}{hint} (log: {self.log_path})")
        err.detail = self.log_tail()  # type: ignore[attr-defined]
        self.stop(grace=3)
        return err

    def wait_until(self, ready, what: str, timeout: float) -> None:
        """Poll `ready()` until true; fail fast if the process dies, with its last log line."""
        deadline = time.monotonic() + timeout
        while True:
            if ready():
                return
            if not self.running():
                code = self.popen.returncode if self.popen else None
                raise self.fail(f"exited (code {code}) before {what}")
            if time.monotonic() > deadline:
                raise self.fail(f"did not {what} within {timeout:.0f} s")
            time.sleep(0.1)

    def wait_for_port(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.wait_until(lambda: port_answers(host, port), f"answer on {host}:{port}", timeout)

    def wait_for_http(self, url: str, timeout: float = 60.0) -> None:
        self.wait_until(lambda: http_ok(url), f"answer at {url}", timeout)

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is not None:
            stop_group(self.popen.pid, grace)
            try:
                self.popen.wait(timeout=5)  # reap, so no zombie remains
            except (subprocess.TimeoutExpired, ChildProcessError):
                pass
        self.pid_path.unlink(missing_ok=True)


def venv_binary(name: str) -> str:
    """A console script of this interpreter's environment, else one on PATH."""
    for candidate in (Path(sys.executable).parent / name, Path(sys.prefix) / "bin" / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if not found:
        raise StackError(f"{name} not found in {Path(sys.executable).parent} or on PATH")
    return found


