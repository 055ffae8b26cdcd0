"""A real Dask scheduler and worker (with its nanny) over TLS on 127.0.0.1, started with the
`dask scheduler` / `dask worker` commands of docs/cluster.md and the files of
`rose cluster certs`: ROSE's client, with the client certificate, runs a task; a client with no
certificate, with a certificate of another CA, or in plain TCP is refused."""
from __future__ import annotations

import asyncio
import gc
import os
import socket
import ssl
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from core.config import DaskTLS
from rose.stack.certs import CertFiles, make_certs
from rose.stack.dask_cluster import check_workers
from coordination.dask_security import DaskScheduler
from coordination.errors import StackError
from rose.stack.ports import LOCALHOST, free_port

DASK = str(Path(sys.executable).with_name("dask"))


def _tls(ca: CertFiles, cert: CertFiles) -> DaskTLS:
    return DaskTLS(ca_file=ca.ca, cert_file=cert.cert("client"), key_file=cert.key("client"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(address, our certificates, another CA's, the scheduler's log); both stop afterwards."""
    root = tmp_path_factory.mktemp("tls")
    ours, theirs = make_certs(root / "ours"), make_certs(root / "theirs")
    port = free_port()
    address = f"tls://{LOCALHOST}:{port}"

    def tls(role: str) -> list[str]:
        return ["--tls-ca-file", str(ours.ca), "--tls-cert", str(ours.cert(role)),
                "--tls-key", str(ours.key(role))]

    env = {**os.environ, "DASK_TEMPORARY_DIRECTORY": str(root / "dask")}
    logs = [open(root / f"{name}.log", "w") for name in ("scheduler", "worker")]
    procs = [subprocess.Popen([DASK, "scheduler", "--protocol", "tls", "--host", LOCALHOST,
                               "--port", str(port), "--no-dashboard", *tls("scheduler")],
                              stdout=logs[0], stderr=subprocess.STDOUT, env=env)]
    procs.append(subprocess.Popen([DASK, "worker", address, "--name", "trainer-0", "--resources",
                                   "train_gpu=1", "--nthreads", "1", "--nanny", "--host", LOCALHOST,
                                   "--no-dashboard", "--death-timeout", "60", *tls("worker")],
                                  stdout=logs[1], stderr=subprocess.STDOUT, env=env))
    try:
        deadline = time.monotonic() + 60
        scheduler = DaskScheduler(address, _tls(ours, ours))
        while True:  # until the worker has registered over TLS
            try:
                if check_workers(scheduler, needed=("train_gpu",), timeout=5):
                    break
            except StackError:
                pass
            assert all(p.poll() is None for p in procs), [(root / f"{n}.log").read_text()
                                                          for n in ("scheduler", "worker")]
            assert time.monotonic() < deadline, "the TLS worker did not register within 60 s"
            time.sleep(0.5)
        yield address, ours, theirs, root / "scheduler.log"
    finally:
        for p in reversed(procs):  # the worker first: it does not chase a gone scheduler
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs:
            f.close()


def test_the_client_certificate_runs_a_task(cluster):
    address, ours, _, _ = cluster
    scheduler = DaskScheduler(address, _tls(ours, ours))
    assert check_workers(scheduler, needed=("train_gpu",)) == {"trainer-0": "trainer"}
    with scheduler.client() as client:
        assert client.submit(pow, 2, 10, pure=False).result(timeout=30) == 1024
        assert all(a.startswith("tls://") for a in client.scheduler_info()["workers"])


def test_rose_status_reaches_the_tls_workers_with_the_recorded_files(cluster, tmp_path, monkeypatch):
    """`rose up --dask-scheduler tls://...` records stack.dask_tls in stack.json; `rose status`,
    a later process with no config, connects with it."""
    from typer.testing import CliRunner

    from rose.cli import app
    from coordination.stack_record import StackHandle
    from rose.stack.local_stack import write_stack

    address, ours, _, _ = cluster
    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    (tmp_path / "stack").mkdir()
    dead = f"http://{LOCALHOST}:{free_port()}"  # no Prefect here: status says so, after the tables
    write_stack(StackHandle(tmp_path / "stack", f"{dead}/api", dead, address, None, None, "filesystem",
                            {"trainer-0": "trainer"}, dask_tls=_tls(ours, ours).model_dump(mode="json")))
    out = CliRunner().invoke(app, ["status"])
    assert "trainer-0" in out.output and "train_gpu=1" in out.output, out.output
    assert "not registered" not in out.output and f"Prefect server at {dead}/api" in out.output


def _until_logged(log: Path, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"the scheduler's log never said {text!r}"
        time.sleep(0.1)


def _refusal(address: str, tls: DaskTLS | None = None) -> Exception:
    """How connecting as ROSE does (its Security) fails. Asynchronously: a refused synchronous
    Client can leave distributed's shared loop thread half stopped for the next one here."""
    from distributed import Client

    async def connect() -> None:
        kwargs = DaskScheduler(address, tls).client_kwargs()
        async with Client(address, asynchronous=True, timeout=5, **kwargs):
            pass

    try:
        asyncio.run(connect())
    except Exception as e:
        error = e.with_traceback(None)
        error.__context__ = error.__cause__ = None
    else:
        raise AssertionError(f"{address} accepted the connection")
    with warnings.catch_warnings():  # the half-made Client, collected now, complains of its loop
        warnings.simplefilter("ignore")
        gc.collect()
    return error


def test_a_client_without_a_certificate_is_refused(cluster):
    address, ours, _, log = cluster
    port = int(address.rpartition(":")[2])
    # trusting the CA but showing no certificate: the scheduler ends the handshake (its alert
    # may reach us, or only the closed connection: TLS 1.3 checks the client's side last)
    ctx = ssl.create_default_context(cafile=ours.ca)
    ctx.check_hostname = False
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED|EOF occurred"):
        with socket.create_connection((LOCALHOST, port), timeout=10) as raw:
            with ctx.wrap_socket(raw) as conn:
                conn.sendall(b"hello")
                conn.recv(1)
    _until_logged(log, "peer did not return a certificate")
    assert isinstance(_refusal(f"tcp://{LOCALHOST}:{port}"), OSError)  # Dask's protocol in clear text
    no_tls = _refusal(address)  # ROSE without stack.dask_tls says what is missing
    assert isinstance(no_tls, StackError) and "speaks TLS: set stack.dask_tls" in str(no_tls)
    _until_logged(log, "wrong version number")  # the scheduler refused the clear text


def test_a_certificate_of_another_ca_is_refused(cluster):
    address, ours, theirs, log = cluster
    # the scheduler's certificate trusted, ours from another CA: the scheduler refuses it
    assert isinstance(_refusal(address, _tls(ours, theirs)), OSError)
    _until_logged(log, "certificate verify failed: unable to get local issuer certificate")
    other = _refusal(address, _tls(theirs, theirs))  # all of the other CA: we refuse the scheduler
    assert isinstance(other, OSError) and "TLS certificate does not match" in str(other)
    with DaskScheduler(address, _tls(ours, ours)).client() as client:  # still serving the right one
        assert client.submit(pow, 3, 2, pure=False).result(timeout=30) == 9

