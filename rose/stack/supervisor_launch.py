"""The `rose` side of the stack's supervisor (rose/stack/supervisor.py): start it and wait
until it says the stack is up (or why not), find it, stop it (`rose down`)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from coordination.errors import PortBusyError, StackError
from coordination.processes import ProcessRecord

LOG = "supervisor.log"  # under the stack's logs/
RECORD = "supervisor.json"  # the supervisor's pid, beside stack.json (not in pids/: see _stop_stack)
STOP_TIMEOUT_S = 90.0  # `rose down` waits this long for the supervisor to stop the services


def launch(cfg, run_dir: Path, prefect_port: int | None,
           scheduler_port: int | None) -> tuple[str, object]:
    """Start the supervisor (it starts the services) and wait until it says they are up:
    (what the start said, e.g. a Mooncake warning; the StackHandle). Raises its StackError."""
    from coordination.stack_record import read_stack

    run_dir = Path(run_dir)
    log_path = run_dir / "logs" / LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    ready_r, ready_w = os.pipe()
    request = json.dumps({"config": cfg.model_dump(mode="json"), "prefect_port": prefect_port,
                          "scheduler_port": scheduler_port, "ready_fd": ready_w,
                          "color": sys.stderr.isatty()})  # its warnings, rendered for our stderr
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "rose.stack.supervisor", str(run_dir)],
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                pass_fds=(ready_w,), start_new_session=True)
    os.close(ready_w)
    try:
        try:
            proc.stdin.write(request.encode())
            proc.stdin.close()
        except BrokenPipeError:  # it died at once: the pipe below says so
            pass
        with os.fdopen(ready_r, "rb") as ready:
            answer = ready.read()  # EOF: it said its piece, or died
    except BaseException:  # Ctrl-C: it stops what it started, then exits
        proc.terminate()
        proc.wait(timeout=STOP_TIMEOUT_S)
        raise
    try:
        said = json.loads(answer)
    except ValueError:
        proc.wait(timeout=30)
        last = _last_line(log_path)
        raise StackError(f"the stack's supervisor exited (code {proc.returncode}) before the "
                         f"stack was up{': ' + last if last else ''} (log: {log_path})") from None
    if "error" in said:
        proc.wait(timeout=30)
        kind = PortBusyError if said.get("type") == "PortBusyError" else StackError
        known = said.get("type") in ("StackError", "PortBusyError")
        err = kind(said["error"] if known else f"{said.get('type')}: {said['error']}")
        err.detail = said.get("detail", "")  # type: ignore[attr-defined]
        if said.get("said"):
            sys.stderr.write(said["said"])
        raise err
    handle = read_stack(run_dir)
    if handle is None:
        raise StackError(f"the stack's supervisor said the stack was up, but wrote no stack "
                         f"file in {run_dir} (log: {log_path})")
    return said.get("said", ""), handle


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def read_supervisor(run_dir: Path) -> ProcessRecord | None:
    try:
        return ProcessRecord(**json.loads((Path(run_dir) / RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def stop_supervisor(record: ProcessRecord, timeout: float = STOP_TIMEOUT_S) -> bool:
    """SIGTERM the supervisor (no restart after it reads that) and wait while it stops the
    services; SIGKILL it (itself only: the caller stops what is left by pid) after `timeout`.
    True when it stopped on its own."""
    try:
        proc = psutil.Process(record.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
        stopped = True
    except psutil.TimeoutExpired:
        proc.kill()
        psutil.wait_procs([proc], timeout=10)
        stopped = False
    except psutil.Error:
        stopped = True
    try:  # reap it where it is our child (a stack started in this process)
        os.waitpid(record.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return stopped
