"""The run lease (coordination/run_lease.py): one driver per run, fault row 9 of issue 14.

Fast: real processes hold the lease, the real `train` flow body and `rose resume` are refused
while another driver runs, and a dead holder (SIGKILL, another host past its deadline) is taken
over. No stack: the first driver waits on a Dask scheduler address that never answers.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from coordination.run_lease import LEASE_FILE, RunLeaseHeld, driving, read_holder

REPO = Path(__file__).resolve().parents[1]

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from coordination.run_lease import driving
    with driving(Path(sys.argv[1]), "r1", command="holder-under-test"):
        print("held", flush=True)
        time.sleep(600)
""")


def start_holder(run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_held_lease_refuses_naming_the_holder_and_sigterm_releases_it(tmp_path):
    holder = start_holder(tmp_path)
    try:
        with pytest.raises(RunLeaseHeld) as e:
            with driving(tmp_path, "r1"):
                pytest.fail("a second driver got the lease")
        msg = str(e.value)
        assert f"pid {holder.pid} on {socket.gethostname()}" in msg
        assert "command `holder-under-test`" in msg and "since " in msg and "UTC" in msg
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(30) == -signal.SIGTERM  # dies of the signal, as without a lease
        assert read_holder(tmp_path) is None  # released, not left stale
    finally:
        holder.kill()


def test_lease_released_on_return_and_on_exception(tmp_path):
    with driving(tmp_path, "r1", command="first") as lease:
        assert read_holder(tmp_path).token == lease.holder.token
        with driving(tmp_path, "r1"):  # the same process re-enters (rose train -> train flow)
            pass
        assert read_holder(tmp_path) is not None  # the inner exit does not release
    assert read_holder(tmp_path) is None
    with pytest.raises(ZeroDivisionError):
        with driving(tmp_path, "r1"):
            1 / 0
    assert read_holder(tmp_path) is None


def test_killed_holder_is_taken_over(tmp_path):
    holder = start_holder(tmp_path)
    holder.kill()  # SIGKILL: no finally, no handler; the lease file stays behind
    holder.wait(30)
    assert read_holder(tmp_path).pid == holder.pid
    with driving(tmp_path, "r1", command="second") as lease:
        assert read_holder(tmp_path).pid == os.getpid() == lease.holder.pid


def test_recycled_pid_is_not_the_holder(tmp_path):
    with driving(tmp_path, "r1") as lease:
        mine = lease.holder
    # our own pid, alive, but a different process start time: the holder it names is gone
    (tmp_path / LEASE_FILE).write_text(json.dumps(asdict(replace(mine, started=mine.started - 3600))))
    with driving(tmp_path, "r1") as lease:
        assert lease.holder.token != mine.token


def test_other_host_holder_is_taken_over_only_past_its_deadline(tmp_path):
    now = time.time()
    with driving(tmp_path, "r1") as lease:
        other = replace(lease.holder, host="another-host", pid=1, token="other", renewed=now)
    (tmp_path / LEASE_FILE).write_text(json.dumps(asdict(other)))
    with pytest.raises(RunLeaseHeld, match="pid 1 on another-host"):
        with driving(tmp_path, "r1"):
            pass
    stale = replace(other, renewed=now - other.ttl_s - 5)
    (tmp_path / LEASE_FILE).write_text(json.dumps(asdict(stale)))
    with driving(tmp_path, "r1") as lease:
        assert read_holder(tmp_path).token == lease.holder.token


def test_holder_renews_and_notices_a_takeover(tmp_path):
    with driving(tmp_path, "r1", ttl_s=0.2) as lease:
        first = read_holder(tmp_path).renewed
        deadline = time.monotonic() + 10
        while read_holder(tmp_path).renewed == first and time.monotonic() < deadline:
            time.sleep(0.02)
        assert read_holder(tmp_path).renewed > first
        lease.check()  # still ours
        thief = replace(read_holder(tmp_path), token="thief", host="another-host")
        (tmp_path / LEASE_FILE).write_text(json.dumps(asdict(thief)))
        while lease.lost is None and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(RunLeaseHeld, match="lost its lease"):
            lease.check()
    assert read_holder(tmp_path).token == "thief"  # not ours any more: left alone


FIRST_DRIVER = textwrap.dedent("""
    import sys
    from flows.train import train
    from core.config import RunConfig
    train.fn(RunConfig(run_id="r1", steps=1, stack={"dask_scheduler": sys.argv[1]}))
""")


def test_second_driver_refused_while_the_train_flow_runs(tmp_path, monkeypatch):
    """The real `train` flow body holds the lease while it drives; `rose resume` and a second
    train flow on the same run are refused, naming it, and leave its saved config alone."""
    from typer.testing import CliRunner

    from flows.train import train
    from rose.cli import app
    from core.config import RunConfig

    silent = socket.socket()  # a "scheduler" that accepts TCP but never answers: prepare() waits
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    address = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
    env = {**os.environ, "ROSE_DATA_DIR": str(tmp_path),
           "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "300s"}
    first = subprocess.Popen([sys.executable, "-c", FIRST_DRIVER, address], cwd=REPO, env=env)
    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    run_dir = tmp_path / "runs" / "r1"
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "config.json").is_file():
            assert first.poll() is None and time.monotonic() < deadline, "first driver never started"
            time.sleep(0.1)
        saved = (run_dir / "config.json").read_text()
        out = CliRunner().invoke(app, ["resume", "r1", "--steps", "9"])
        assert out.exit_code == 1
        assert "being driven by another driver" in out.output and f"pid {first.pid} " in out.output
        assert "resuming run" not in out.output  # refused before it claims to resume
        with pytest.raises(RunLeaseHeld, match=f"pid {first.pid} "):
            train.fn(RunConfig(run_id="r1", steps=7, stack={"dask_scheduler": address}))
        assert (run_dir / "config.json").read_text() == saved and first.poll() is None
        first.terminate()
        assert first.wait(30) == -signal.SIGTERM
        assert read_holder(run_dir) is None
    finally:
        first.kill()
        silent.close()


def test_driver_command_names_what_the_user_ran(monkeypatch):
    """The refusal names the other driver as its user typed it: `python -m rose.cli ...` shows
    the interpreter's own arguments (sys.argv[0] is only cli.py there), a script its name, and
    a deployment's process its Prefect flow run."""
    from coordination import run_lease

    monkeypatch.setattr(sys, "argv", ["/x/.venv/bin/rose", "train", "--steps", "5"])
    monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
    assert run_lease.driver_command() == "rose train --steps 5"
    monkeypatch.setattr(sys, "argv", ["/x/rose/cli.py", "resume", "r1"])
    monkeypatch.setattr(sys, "orig_argv", ["/usr/bin/python3", "-m", "rose.cli", "resume", "r1"])
    assert run_lease.driver_command() == "python3 -m rose.cli resume r1"
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", "abc")
    assert run_lease.driver_command().endswith("(Prefect flow run abc)")
    monkeypatch.setattr(sys, "argv", ["rose", "x" * 300])
    assert len(run_lease.driver_command().split(" (Prefect")[0]) == 200
