"""Cluster mode, secured as docs/cluster.md says, trains: certificates from `rose cluster certs`,
a Prefect server with basic auth, a Dask scheduler and a trainer and a rollout worker started
over mutual TLS with the commands and environment of docs/cluster.md (sections 2, 3 and 6), the
filesystem relay; then `rose up` and `rose train --steps 2` take the addresses from a config
file, as on a cluster. Without the auth string the Prefect API answers 401; a client without a
certificate is refused (tests/test_dask_tls.py checks the refusals one by one)."""
from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.stack_fixtures import cli_stack_env, new_data_dir, rose_cli

pytestmark = [pytest.mark.slow, pytest.mark.models]
RUN = "tls-cluster"


def _tls_flags(certs: Path, role: str) -> list[str]:
    return ["--tls-ca-file", str(certs / "ca.pem"), "--tls-cert", str(certs / f"{role}.pem"),
            "--tls-key", str(certs / f"{role}-key.pem")]


def _answers(url: str, headers: dict[str, str] | None = None) -> int:
    """The HTTP status a POST of an empty filter gets (no proxy: loopback)."""
    req = urllib.request.Request(url, data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_tls_cluster_with_prefect_auth_trains_two_steps(tmp_path_factory):
    from core.config import RolloutConfig, RunConfig, stack_dir
    from rose.stack.dask_cluster import worker_command, worker_env, worker_specs
    from rose.stack.ports import LOCALHOST, free_port
    from rose.stack.prefect_server import launch_prefect_server, prefect_env
    from rose.stack.process import ManagedProcess, venv_binary

    data = new_data_dir(tmp_path_factory, "rose-tls-cluster")
    with cli_stack_env(data) as env, ExitStack() as services:
        certs = data / "certs"
        made = rose_cli(["cluster", "certs", str(certs)], env, timeout=120)
        assert made.returncode == 0, made.stderr
        cluster_dir = data / "cluster"  # the operator's processes: logs and pids
        auth = f"rose:{secrets.token_hex(8)}"

        # Prefect server with basic auth (the server's setting; clients send theirs)
        os.environ["PREFECT_SERVER_API_AUTH_STRING"] = auth
        try:
            prefect = launch_prefect_server(cluster_dir)
        finally:
            del os.environ["PREFECT_SERVER_API_AUTH_STRING"]
        services.callback(prefect.stop)
        prefect.wait()
        assert _answers(f"{prefect.api_url}/flows/filter") == 401  # no auth string: refused

        # Dask scheduler and workers over TLS, the workers with docs/cluster.md's environment
        address = f"tls://{LOCALHOST}:{free_port()}"
        scheduler = ManagedProcess("dask-scheduler", [
            venv_binary("dask"), "scheduler", "--protocol", "tls", "--host", LOCALHOST,
            "--port", address.rpartition(":")[2], "--no-dashboard", *_tls_flags(certs, "scheduler")],
            cluster_dir, env={"DASK_TEMPORARY_DIRECTORY": str(cluster_dir / "dask")}).start()
        services.callback(scheduler.stop)
        scheduler.wait_for_port(LOCALHOST, int(address.rpartition(":")[2]), timeout=60)
        relay_dir = stack_dir()  # the filesystem relay on the "shared filesystem"
        base = {**prefect_env(prefect.api_url, prefect.home), "PREFECT_API_AUTH_STRING": auth,
                "ROSE_RELAY": "filesystem", "ROSE_RUN_DIR": str(relay_dir)}
        for spec in worker_specs(trainers=1, rollout=1):
            local = cluster_dir / "dask" / spec.name
            local.mkdir(parents=True, exist_ok=True)
            argv = [*worker_command(spec, address, local), *_tls_flags(certs, "worker")]
            worker = ManagedProcess(f"worker-{spec.name}", argv, cluster_dir,
                                    env=worker_env(spec, cluster_dir, base), nice=spec.nice).start()
            services.callback(worker.stop)

        # the user's side: addresses, certificate and auth string, nothing started for Dask
        env = {**env, "PREFECT_API_AUTH_STRING": auth}
        tls = {"ca_file": str(certs / "ca.pem"), "cert_file": str(certs / "client.pem"),
               "key_file": str(certs / "client-key.pem")}
        cfg = RunConfig(run_id=RUN, steps=2, seed=5, rollout=RolloutConfig(groups=2, group_size=4, max_turns=3))
        config = json.loads(cfg.model_dump_json())
        config["stack"].update(dask_scheduler=address, dask_tls=tls, prefect_api_url=prefect.api_url,
                               relay="filesystem")
        cfg_file = data / "cluster.json"
        cfg_file.write_text(json.dumps(config))
        deadline = time.monotonic() + 120  # workers register over TLS (the rollout one loads vLLM)
        while (up := rose_cli(["up", "-c", str(cfg_file)], env, timeout=300)).returncode != 0:
            assert "has no worker with" in up.stderr, up.stderr[-2000:]
            assert time.monotonic() < deadline, up.stderr[-2000:]
            time.sleep(2)
        assert address in up.stdout

        trained = rose_cli(["train", "-c", str(cfg_file)], env, timeout=600)
        assert trained.returncode == 0, trained.stderr[-3000:]
        steps = json.loads((cfg.run_dir() / "summary.json").read_text())["steps"]
        assert [s["step"] for s in steps] == [1, 2]
        assert all(s["trajectories"] > 0 for s in steps), steps
        # the flow runs reached the authenticated server: listed with the auth string
        listed = _answers(f"{prefect.api_url}/flow_runs/filter",
                          {"Authorization": "Basic " + _basic(auth)})
        assert listed == 200
        down = rose_cli(["down"], env, timeout=120)
        assert down.returncode == 0, down.stderr


def _basic(auth: str) -> str:
    import base64

    return base64.b64encode(auth.encode()).decode()
