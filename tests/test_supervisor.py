"""The stack's supervisor (rose/stack/supervisor.py) without a stack: its restart policy as
plain Python, then the supervisor itself over a few `sleep` processes standing for services
(seconds, no Dask, no Mooncake). The whole stack's restarts: tests/test_stack.py (a Mooncake
master killed) and tests/test_borrow_e2e.py (a serving worker's nanny killed)."""
from __future__ import annotations

import io
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from coordination.stack_record import StackHandle, dead_parts, read_stack, recovering_parts
from rose.stack.local_stack import write_stack
from coordination.processes import ProcessRecord
from rose.stack.process import ManagedProcess
from rose.stack.supervisor import RestartPolicy, Service, Supervisor


# ---- the policy ---------------------------------------------------------------------------

def test_backoff_doubles_and_gives_up_at_the_fifth_exit_in_a_minute():
    policy = RestartPolicy(base_s=0.5, cap_s=30, max_exits=5, window_s=60)
    assert [policy.exited(t) for t in (0, 1, 2, 3)] == [0.5, 1.0, 2.0, 4.0]
    assert policy.exited(59.9) is None  # the 5th within 60 s: failed
    assert policy.why_failed() == "exited 5 times within 60 s"


def test_exits_outside_the_window_are_forgotten():
    policy = RestartPolicy(base_s=1, max_exits=5, window_s=60)
    delays = [policy.exited(t) for t in (0, 20, 40, 61, 81, 101, 122)]
    # never more than 3 exits inside any 60 s: restarted every time, the backoff follows
    assert None not in delays and delays[:3] == [1, 2, 4] and max(delays) == 4


def test_backoff_is_capped():
    policy = RestartPolicy(base_s=1, cap_s=5, max_exits=100, window_s=60)
    assert [policy.exited(t) for t in range(6)] == [1, 2, 4, 5, 5, 5]


# ---- the supervisor over stand-in processes -------------------------------------------------

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


@pytest.fixture
def supervised(tmp_path):
    """Two stand-in services under a Supervisor (fast backoff), their stack file written; the
    loop is driven here by tick(), as run() does it."""
    procs = [ManagedProcess(name, SLEEPER, tmp_path).start() for name in ("worker-a", "mooncake-master")]
    me = psutil.Process()
    handle = StackHandle(tmp_path, "http://127.0.0.1:1/api", "http://127.0.0.1:1", "tcp://127.0.0.1:1",
                         None, None, "filesystem", {"a": "serving"},
                         processes=[p.record for p in procs],
                         supervisor=ProcessRecord("supervisor", me.pid, me.create_time(),
                                                  str(tmp_path / "logs" / "supervisor.log")))
    write_stack(handle)
    log = io.StringIO()
    sup = Supervisor(tmp_path, [Service(p, policy=RestartPolicy(base_s=0.05, window_s=60))
                                for p in procs], log)
    sup.save()
    try:
        yield sup, log
    finally:
        sup.stop_all()


def _drive(sup: Supervisor, until, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "the supervisor never got there"
        sup.tick(time.monotonic())
        time.sleep(0.02)


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)  # reaped by its parent (the supervisor's poll), as in the stack


def test_a_killed_service_is_restarted_and_the_restart_recorded(supervised):
    sup, log = supervised
    svc = sup.services[0]
    old = svc.proc.pid
    _kill(old)
    _drive(sup, lambda: svc.restarts == 1 and svc.state == "up")
    assert svc.proc.pid != old and svc.proc.running()
    handle = read_stack(sup.run_dir)
    [restart] = handle.restarts
    assert restart["service"] == "worker-a" and restart["exit_code"] == -signal.SIGKILL
    assert restart["restart"] == 1 and restart["pid"] == svc.proc.pid
    assert {p.name: p.pid for p in handle.processes}["worker-a"] == svc.proc.pid  # `rose down` finds it
    assert handle.services["worker-a"]["restarts"] == 1
    assert "restarted worker-a: restart 1" in log.getvalue()
    assert dead_parts(handle) == [f"Dask scheduler at {handle.dask_scheduler}",
                                  f"Prefect server at {handle.prefect_api_url}"]  # none of ours


PARENT = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, "
          "'-c', 'import time; time.sleep(300)']); print('up', flush=True); time.sleep(300)"]


def test_what_a_dead_service_leaves_in_its_group_goes_before_the_restart(tmp_path):
    """A nanny SIGKILLed leaves its worker (which holds the endpoint's port): stopped first."""
    proc = ManagedProcess("worker-n", PARENT, tmp_path).start()
    sup = Supervisor(tmp_path, [Service(proc, policy=RestartPolicy(base_s=60))], io.StringIO())
    try:
        deadline = time.monotonic() + 20
        while not psutil.Process(proc.pid).children():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [child] = psutil.Process(proc.pid).children()
        _kill(proc.pid)
        _drive(sup, lambda: sup.services[0].state == "restarting")
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    finally:
        sup.stop_all()


def test_a_frozen_process_is_stopped_by_its_sigterm_not_left_for_the_sigkill(tmp_path):
    """`rose down` on a SIGSTOPped service (chaos fault 1b freezes a restarting worker): it is
    continued, so the SIGTERM acts now, rather than the grace period passing before a SIGKILL."""
    import subprocess

    from coordination.processes import stop_group

    termed = tmp_path / "termed"
    proc = subprocess.Popen([sys.executable, "-c", (
        "import pathlib, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path({str(termed)!r}).touch(), sys.exit(0)))\n"
        "print('up', flush=True); time.sleep(300)")], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline() == b"up\n"
    os.kill(proc.pid, signal.SIGSTOP)
    stop_group(proc.pid, grace=120)  # without the SIGCONT: 120 s, then a SIGKILL
    assert termed.exists()  # its SIGTERM handler ran


def test_five_exits_in_a_minute_mark_it_failed_and_the_rest_runs_on(supervised):
    sup, log = supervised
    svc, other = sup.services
    for n in range(4):
        _kill(svc.proc.pid)
        _drive(sup, lambda: svc.restarts == n + 1 and svc.state == "up")
    _kill(svc.proc.pid)
    _drive(sup, lambda: svc.state == "failed")
    for _ in range(20):  # and it stays down
        sup.tick(time.monotonic())
    assert svc.restarts == 4 and not svc.proc.running()
    assert other.state == "up" and other.proc.running() and other.restarts == 0
    handle = read_stack(sup.run_dir)
    seen = handle.services["worker-a"]
    assert seen["state"] == "failed" and seen["last_exit"] == -signal.SIGKILL
    assert seen["log"] == str(svc.proc.log_path)
    [dead] = [d for d in dead_parts(handle) if d.startswith("worker-a")]
    assert "exited 5 times within 60 s" in dead and f"last exit code {-signal.SIGKILL}" in dead
    assert str(svc.proc.log_path) in dead
    assert "FAILED: worker-a exited 5 times within 60 s" in log.getvalue()

    from rose.stack.status import print_restarts

    out = Console(file=io.StringIO(), width=200)
    print_restarts(handle, out)
    shown = out.file.getvalue()
    assert "FAILED: worker-a" in shown and "last exit code -9" in shown and "worker-a" in shown


def test_a_service_no_restart_mends_fails_at_its_first_exit(supervised):
    sup, log = supervised
    svc = sup.services[1]
    svc.never_restart = "exited: not restarted in place"
    _kill(svc.proc.pid)
    _drive(sup, lambda: svc.state == "failed")
    assert svc.restarts == 0 and read_stack(sup.run_dir).services[svc.name]["why"] == svc.never_restart
    assert sup.services[0].state == "up"


def test_stop_wins_over_a_pending_restart(supervised):
    """`rose down` (SIGTERM: ask_stop) while a service waits out its backoff: nothing starts."""
    sup, _ = supervised
    svc = sup.services[0]
    svc.policy = RestartPolicy(base_s=0.3)
    old = svc.proc.pid
    _kill(old)
    _drive(sup, lambda: svc.state == "restarting")
    assert recovering_parts(read_stack(sup.run_dir)) == ["worker-a (restarting)"]
    sup.ask_stop()
    time.sleep(0.4)
    sup.tick(time.monotonic())
    assert svc.state == "restarting" and svc.proc.popen.pid == old  # never started again
    sup.stop_all()
    assert not any(s.proc.running() for s in sup.services)


def test_restarting_is_not_dead_while_the_supervisor_lives(tmp_path):
    dead_pid_record = ProcessRecord("mooncake-master", 2**22 - 1, 0.0, str(tmp_path / "m.log"))
    me = psutil.Process()
    handle = StackHandle(tmp_path, "http://127.0.0.1:1/api", "http://127.0.0.1:1", "tcp://127.0.0.1:1",
                         "127.0.0.1:1", None, "mooncake", {}, processes=[dead_pid_record],
                         supervisor=ProcessRecord("supervisor", me.pid, me.create_time(), ""),
                         services={"mooncake-master": {"state": "restarting", "restarts": 1}})
    assert not [d for d in dead_parts(handle) if "ooncake" in d]
    assert recovering_parts(handle) == ["mooncake-master (restarting)"]
    handle.supervisor = ProcessRecord("supervisor", 2**22 - 1, 0.0, "")  # the supervisor is gone
    dead = dead_parts(handle)
    assert dead[0].startswith("stack supervisor (pid") and "mooncake-master (pid" in " ".join(dead)
    assert recovering_parts(handle) == []


def test_the_stack_file_update_keeps_other_writers_fields(tmp_path):
    from rose.stack.local_stack import update_stack

    handle = StackHandle(tmp_path, "http://x/api", "http://x", "tcp://127.0.0.1:1", None, None,
                         "filesystem", {})
    write_stack(handle)
    update_stack(tmp_path, lambda h: setattr(h, "endpoints", {"serving-0": "http://e"}))
    update_stack(tmp_path, lambda h: setattr(h, "restarts", [{"service": "s"}]))
    again = read_stack(tmp_path)
    assert again.endpoints == {"serving-0": "http://e"} and again.restarts == [{"service": "s"}]
    (Path(tmp_path) / "stack.json").unlink()
    assert update_stack(tmp_path, lambda h: None) is None  # stopped meanwhile: not recreated
    assert not (Path(tmp_path) / "stack.json").exists()


def test_the_chaos_bench_reads_serving_downtime_from_the_users_requests():
    """tests/chaos_serving.downtime: first failed (after the fault) to first answered request."""
    from tests.chaos_serving import downtime

    nan = float("nan")
    fault = 100.0
    requests = [(90.0, 1.0, True),  # served before the fault
                (99.0, nan, False),  # in flight at the fault: fails at it
                (101.0, nan, False), (110.0, nan, False),  # refused while it is down
                (121.0, 2.0, True),  # answered: back
                (125.0, nan, False)]  # a failure after it came back
    assert downtime(requests, fault) == {"serving_down_s": 21.0, "serving_failed_in_down": 3,
                                         "serving_failed_outside": 1}
    assert downtime(requests[:4], fault)["serving_down_s"] is None  # never answered again
    assert downtime([(90.0, 1.0, True)], fault)["serving_down_s"] == 0.0
    assert downtime(requests, None) == {}
