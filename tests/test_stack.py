"""The local stack: ports, managed processes, Mooncake services, the whole stack, the CLI."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from coordination.errors import PortBusyError, StackError
from coordination.probes import port_answers
from rose.stack.ports import ensure_free, free_port, pick_port
from coordination.processes import read_records
from rose.stack.process import ManagedProcess


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def _dead(pids) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


# ---- ports ------------------------------------------------------------------------------

def test_busy_port_is_named(listener):
    with pytest.raises(PortBusyError, match=f"^port {listener} on 127.0.0.1 is busy$"):
        ensure_free(listener)
    with pytest.raises(PortBusyError):
        pick_port(listener)


def test_free_port_is_bindable_and_silent():
    port = free_port()
    assert ensure_free(port) == port
    assert not port_answers("127.0.0.1", port)
    assert pick_port(None) != 0


def test_free_ports_come_from_outside_the_ephemeral_range():
    """A port handed out is bound by its server seconds later; meanwhile the kernel gives
    processes that bind port 0 (Dask workers) ports from its ephemeral range, so ours never
    come from there, and never twice."""
    from rose.stack.ports import ephemeral_ports

    first, last = ephemeral_ports()
    assert 1024 <= first < last <= 65535
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if first <= p <= last or 15_000 <= p < 17_000]  # nor Mooncake's
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # what a Dask worker gets
        s.bind(("127.0.0.1", 0))
        assert first <= s.getsockname()[1] <= last


# ---- managed processes ------------------------------------------------------------------

# A leader with a child in its group and an orphan (double fork: re-parented to init).
FAMILY = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(300)
    os._exit(0)
print("up" + "-and-running", flush=True)
time.sleep(300)
"""


def test_stop_kills_the_whole_group(tmp_path):
    proc = ManagedProcess("family", [sys.executable, "-c", FAMILY], tmp_path).start()
    proc.wait_until(lambda: "up-and-running" in proc.log_tail(), "say it runs", timeout=20)
    members = [p.pid for p in psutil.process_iter() if _pgid(p.pid) == proc.pid]
    assert len(members) >= 3  # leader, child, orphan
    assert [r.pid for r in read_records(tmp_path)] == [proc.pid]
    proc.stop(grace=2)
    assert _dead(members)
    assert read_records(tmp_path) == []
    assert (tmp_path / "logs" / "family.log").exists()


def test_stop_escalates_to_sigkill(tmp_path):
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
               "print('up' + '-and-running', flush=True); time.sleep(300)"
    proc = ManagedProcess("stubborn", [sys.executable, "-c", stubborn], tmp_path).start()
    proc.wait_until(lambda: "up-and-running" in proc.log_tail(), "say it runs", timeout=20)
    proc.stop(grace=0.5)
    assert _dead([proc.pid])


def test_early_exit_reports_last_log_line(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('boom: no config'); sys.exit(3)"]
    proc = ManagedProcess("crasher", argv, tmp_path).start()
    with pytest.raises(StackError, match=r"crasher exited \(code 3\).*boom: no config"):
        proc.wait_for_port("127.0.0.1", free_port(), timeout=20)


def test_missing_binary_is_named(tmp_path):
    with pytest.raises(StackError, match="executable not found: /nonexistent/server"):
        ManagedProcess("ghost", ["/nonexistent/server"], tmp_path).start()


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


# ---- Mooncake -----------------------------------------------------------------------------

@pytest.fixture
def mooncake(tmp_path, monkeypatch):
    from rose.stack.mooncake import mooncake_env, start_mooncake

    services = start_mooncake(tmp_path)
    for k, v in mooncake_env(services).items():
        monkeypatch.setenv(k, v)
    yield services
    services.stop()


def test_mooncake_put_get_round_trip(mooncake):
    from rose.stack.mooncake import open_store

    assert mooncake.master_addr.startswith("127.0.0.1:")
    assert mooncake.metadata_url.startswith("http://127.0.0.1:")
    store = open_store()
    payload = bytes(range(256)) * 4096  # 1 MiB, every byte value
    assert store.put("rose-test/v1", payload) == 0
    assert store.get("rose-test/v1") == payload
    assert store.get("rose-test/missing") == b""
    pids = [p.pid for p in mooncake.processes]
    mooncake.stop()
    assert _dead(pids)


def test_dead_master_gives_clear_error(mooncake):
    from rose.stack.mooncake import open_store

    master = next(p for p in mooncake.processes if p.name == "mooncake-master")
    master.stop(grace=2)
    with pytest.raises(StackError, match=f"master at {mooncake.master_addr} does not answer"):
        open_store()


def test_client_setup_fails_fast_without_master(tmp_path):
    """The one client setup (storage/relay/mooncake.open_store) sets MC_STORE_CLIENT_SETUP_RETRIES=1:
    without a master it fails with a RelayError instead of blocking ~90 s. In a subprocess: the
    env it sets must not leak into this one."""
    code = (
        "from storage.relay.base import RelayError\n"
        "from storage.relay.mooncake import open_store\n"
        "try:\n"
        f"    open_store('127.0.0.1:{free_port()}', 'http://127.0.0.1:{free_port()}/metadata',"
        " 16 << 20, 16 << 20)\n"
        "except RelayError as e:\n"
        "    print('failed:', e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MC_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert "failed: mooncake relay: client setup against master" in out.stdout, out.stderr[-2000:]


# ---- the whole stack (slow) ----------------------------------------------------------------

@pytest.mark.slow
def test_whole_stack_up_status_down(tmp_path, monkeypatch):
    from distributed import Client
    from typer.testing import CliRunner

    from rose.cli import app
    from core.config import StackConfig
    from rose.stack.dask_cluster import worker_identity
    from coordination.stack_record import load_stack, read_stack
    from rose.stack.local_stack import start_stack, stop_stack
    from rose.stack.mooncake import round_trip
    from coordination.processes import group_members

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    run_dir = tmp_path / "stack"  # core.config.stack_dir()
    handle = start_stack(StackConfig(rollout_workers=1), run_dir)
    pids = [p.pid for p in handle.processes]
    family = [q.pid for pid in pids for q in [psutil.Process(pid), *psutil.Process(pid).children(True)]]
    try:
        # every service listens on loopback only (Dask's /health and /metrics HTTP servers
        # bound 0.0.0.0 until told otherwise); checked before any worker opens a Mooncake
        # client, whose transfer engine listens on all interfaces (docs/reliability.md, ports)
        def exposed() -> list:
            return [(c.laddr, pid) for pid in family
                    for c in psutil.Process(pid).net_connections()
                    if c.status == psutil.CONN_LISTEN and c.laddr.ip not in ("127.0.0.1", "::1")]
        # the one exception (docs/reliability.md, ports): the store client's transfer engine, 2 ports
        store_client = {p.pid for p in handle.processes if p.name == "mooncake-store-client"}
        assert handle.mooncake_client and len(store_client) == 1
        assert {pid for _, pid in exposed()} == store_client and len(exposed()) == 2, exposed()
        assert handle.relay == "mooncake"
        assert handle.workers == {"trainer-0": "trainer", "rollout-0": "rollout"}
        assert json_load(run_dir / "stack.json")["dask_scheduler"] == handle.dask_scheduler
        with Client(handle.dask_scheduler, timeout=30) as client:
            info = client.scheduler_info(n_workers=-1)["workers"].values()
            by_name = {w["name"]: w for w in info}
            assert by_name["trainer-0"]["resources"] == {"train_gpu": 1}
            assert by_name["rollout-0"]["resources"] == {"rollout_gpu": 1}
            assert (by_name["trainer-0"]["nthreads"], by_name["rollout-0"]["nthreads"]) == (1, 2)
            on_rollout = {"resources": {"rollout_gpu": 1}, "pure": False}
            who = client.submit(worker_identity, **on_rollout).result(60)
            # the worker reaches Mooncake with the env it was given
            moved = client.submit(round_trip, 3 << 20, **on_rollout).result(60)
        # the worker's store client is a client of the stack's: it opens no port of its own
        assert {pid for _, pid in exposed()} == store_client, exposed()
        assert who == {"ROSE_WORKER_NAME": "rollout-0", "ROSE_WORKER_KIND": "rollout",
                       "ROSE_RELAY": "mooncake", "PREFECT_API_URL": handle.prefect_api_url,
                       "VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                       "ROSE_MOONCAKE_MASTER": handle.mooncake_master,
                       "ROSE_MOONCAKE_CLIENT": handle.mooncake_client}
        assert moved == 3 << 20
        assert load_stack(run_dir) == handle
        assert start_stack(StackConfig(rollout_workers=1), run_dir) == handle  # reused, not restarted

        runner = CliRunner()
        ok = runner.invoke(app, ["status"])
        assert ok.exit_code == 0, ok.output
        assert "rollout-0" in ok.output and "train_gpu=1" in ok.output

        # the supervisor (rose/stack/supervisor.py) restarts a killed service at its address
        supervisor = handle.supervisor
        assert supervisor is not None and supervisor.alive()
        assert psutil.Process(supervisor.pid).children() and all(
            psutil.Process(p.pid).ppid() == supervisor.pid for p in handle.processes)
        master = next(p for p in handle.processes if p.name == "mooncake-master")
        os.kill(master.pid, 9)
        back = _until(lambda: _restarted(run_dir, "mooncake-master", 1))
        assert back.mooncake_master == handle.mooncake_master
        [restart] = back.restarts
        assert restart["service"] == "mooncake-master" and restart["exit_code"] == -9
        assert restart["restart"] == 1 and restart["pid"] != master.pid
        with Client(handle.dask_scheduler, timeout=30) as client:  # the relay works again, once
            # the store client has registered with the new master (seconds; a new relay
            # client's set-up fails its health check until then)
            assert _until(lambda: _relay_round_trip(client, on_rollout)) == 1 << 20
        shown = runner.invoke(app, ["status"])
        assert shown.exit_code == 0, shown.output
        assert "Restarts by the supervisor" in shown.output and "mooncake-master" in shown.output

        # five exits within a minute: failed, said, never restarted again; the rest runs on
        for n in range(2, 6):
            pid = next(p.pid for p in read_stack(run_dir).processes if p.name == "mooncake-master")
            os.kill(pid, 9)
            if n < 5:
                _until(lambda: _restarted(run_dir, "mooncake-master", n))
        failed = _until(lambda: _failed(run_dir, "mooncake-master"))
        assert failed.services["mooncake-master"]["last_exit"] == -9
        degraded = runner.invoke(app, ["status"])
        assert degraded.exit_code == 1
        assert "FAILED: mooncake-master" in degraded.output and "Traceback" not in degraded.output
        assert "exited 5 times within 60 s" in degraded.output and "mooncake-master.log" in degraded.output
        assert load_stack(run_dir) is None
        assert [p.name for p in failed.processes if not p.alive()] == ["mooncake-master"]
        host, port = handle.dask_scheduler.removeprefix("tcp://").split(":")
        assert port_answers(host, int(port))  # the rest of the stack runs on

        # without its supervisor the stack is degraded: nothing would restart what exits
        os.kill(supervisor.pid, 9)
        psutil.wait_procs([psutil.Process(supervisor.pid)], timeout=10)
        unsupervised = runner.invoke(app, ["status"])
        assert unsupervised.exit_code == 1 and "stack supervisor" in unsupervised.output

        down = runner.invoke(app, ["down"])
        assert down.exit_code == 0, down.output
    finally:
        stop_stack(run_dir)
    assert _dead(family) and _dead([supervisor.pid])
    assert not any(group_members(pid) for pid in pids)
    assert not (run_dir / "stack.json").exists()


def _relay_round_trip(client, placement: dict) -> int:
    """Bytes a worker put and got back through the stack's relay; 0 while it cannot yet."""
    from coordination.errors import StackError
    from rose.stack.mooncake import round_trip

    try:
        return client.submit(round_trip, 1 << 20, **placement).result(60)
    except StackError:
        return 0


def _until(get, timeout: float = 60.0):
    import time

    deadline = time.monotonic() + timeout
    while not (got := get()):
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.1)
    return got


def _restarted(run_dir: Path, name: str, n: int):
    from coordination.stack_record import read_stack

    handle = read_stack(run_dir)
    seen = handle.services.get(name, {}) if handle else {}
    return handle if seen.get("restarts") == n and seen.get("state") == "up" else None


def _failed(run_dir: Path, name: str):
    from coordination.stack_record import read_stack

    handle = read_stack(run_dir)
    return handle if handle and handle.services.get(name, {}).get("state") == "failed" else None


def json_load(path: Path):
    import json

    return json.loads(path.read_text())


# ---- the CLI on bad input ------------------------------------------------------------------

def _cli(*args: str, env: dict | None = None):
    from typer.testing import CliRunner

    from rose.cli import app

    return CliRunner().invoke(app, list(args), env=env)


def test_cli_unknown_config_key(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("run_id: x\nstack:\n  rollout_workers: 1\n  gpus: 4\n")
    res = _cli("up", "--config", str(cfg))
    assert res.exit_code == 1
    assert res.output.strip() == f"error: unknown config key 'stack.gpus' in {cfg}"


def test_cli_bad_value_and_missing_file(tmp_path):
    res = _cli("up", "--rollout-workers", "99")
    assert res.exit_code == 1
    assert "'stack.rollout_workers'" in res.output and "less than or equal to 8" in res.output
    res = _cli("up", "--config", str(tmp_path / "nope.json"))
    assert res.exit_code == 1
    assert res.output.strip() == f"error: config file not found: {tmp_path / 'nope.json'}"


def test_cli_busy_port_starts_nothing(tmp_path, listener):
    res = _cli("up", "--prefect-port", str(listener), env={"ROSE_DATA_DIR": str(tmp_path)})
    assert res.exit_code == 1
    assert res.output.strip() == f"error: port {listener} on 127.0.0.1 is busy"
    assert read_records(tmp_path / "stack") == []


def test_cli_status_without_stack_in_a_real_process(tmp_path):
    env = {**os.environ, "ROSE_DATA_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "rose.cli", "status"],
                         env=env, capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        f"error: no stack running in {tmp_path / 'stack'} (start one with `rose up`)"]


def test_mooncake_failure_falls_back_to_filesystem_loudly(tmp_path, monkeypatch, capsys):
    from core.config import StackConfig
    from rose.stack import local_stack

    def broken(run_dir, **_):
        raise StackError("mooncake_master not found")

    monkeypatch.setattr(local_stack, "start_mooncake", broken)
    assert local_stack._start_relay(StackConfig(relay="auto"), tmp_path) is None
    err = capsys.readouterr().err
    assert "mooncake_master not found" in err and "FILESYSTEM relay" in err
    assert local_stack._start_relay(StackConfig(relay="filesystem"), tmp_path) is None
    with pytest.raises(StackError, match="mooncake_master not found"):  # asked for explicitly
        local_stack._start_relay(StackConfig(relay="mooncake"), tmp_path)


def test_a_store_client_that_did_not_start_is_said_loudly(tmp_path, monkeypatch, capsys):
    from core.config import StackConfig
    from rose.stack import local_stack
    from rose.stack.mooncake import MooncakeServices, mooncake_env

    asked = {}

    def no_client(run_dir, store_mb):
        asked["store_mb"] = store_mb
        return MooncakeServices("127.0.0.1:1", "http://127.0.0.1:2/metadata",
                                client_error="mooncake-store-client exited (code 1)")

    monkeypatch.setattr(local_stack, "start_mooncake", no_client)
    services = local_stack._start_relay(StackConfig(relay="auto", relay_store_mb=512), tmp_path)
    assert services is not None and asked == {"store_mb": 512}
    err = capsys.readouterr().err
    assert "no Mooncake store client" in err and "exited (code 1)" in err
    assert "ROSE_MOONCAKE_CLIENT" not in mooncake_env(services)  # workers keep TCP clients
