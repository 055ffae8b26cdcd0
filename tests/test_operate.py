"""Fast checks of the operating surface: prefect.yaml, forms, CLI errors, cluster addresses."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rose.stack.ports import free_port

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, data: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["ROSE_DATA_DIR"] = str(data)
    return subprocess.run([sys.executable, "-m", "rose.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_prefect_yaml_deploys_every_flow_on_the_process_pool_with_pydantic_forms():
    from prefect.flows import load_flow_from_entrypoint

    from rose.deploy import DEPLOYMENTS, POOL

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    step = spec["pull"][0]["prefect.deployments.steps.set_working_directory"]
    assert step["directory"] == "{{ $ROSE_REPO_ROOT }}"
    names = []
    for d in spec["deployments"]:
        assert d["work_pool"]["name"] == POOL
        flow = load_flow_from_entrypoint(d["entrypoint"])
        names.append(f"{flow.name}/{d['name']}")
        schema = flow.parameters.model_dump()
        assert schema["definitions"], f"{d['name']}: parameters are not pydantic models"
        for name, prop in schema["properties"].items():  # every field has a form default
            assert "default" in prop or name in schema.get("required", []) or \
                name == "request", (d["name"], name)
    assert sorted(names) == sorted(DEPLOYMENTS)


def test_train_form_defaults_are_run_config_defaults():
    from prefect.flows import load_flow_from_entrypoint

    from core.config import RunConfig

    schema = load_flow_from_entrypoint("flows/train.py:train").parameters.model_dump()
    default = schema["properties"]["cfg"]["default"]
    assert default == RunConfig().model_dump(mode="json")


def test_worker_env_names_the_checkout_and_polls_fast():
    from rose.deploy import REPO_ROOT, worker_env

    env = worker_env({"PREFECT_API_URL": "http://127.0.0.1:1/api", "ROSE_DATA_DIR": "/d"})
    assert env["ROSE_REPO_ROOT"] == str(REPO_ROOT) == str(REPO)
    assert env["PREFECT_WORKER_QUERY_SECONDS"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:1/api"


def test_flows_use_the_given_dask_scheduler_first(tmp_path, monkeypatch):
    from flows.train import dask_scheduler
    from core.config import RunConfig, StackConfig

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    cfg = RunConfig(stack=StackConfig(dask_scheduler="tcp://10.1.2.3:8786"))
    assert dask_scheduler(cfg).address == "tcp://10.1.2.3:8786" and dask_scheduler(cfg).tls is None
    monkeypatch.delenv("ROSE_DASK_SCHEDULER", raising=False)
    with pytest.raises(RuntimeError, match="no Dask scheduler"):
        dask_scheduler(RunConfig())
    monkeypatch.setenv("ROSE_DASK_SCHEDULER", "tcp://127.0.0.1:9")  # a deployment worker's env
    assert dask_scheduler(RunConfig()).address == "tcp://127.0.0.1:9"


def test_up_with_addresses_that_do_not_answer_fails_in_one_line(tmp_path):
    api = f"http://127.0.0.1:{free_port()}/api"
    out = _cli("up", "--dask-scheduler", f"tcp://127.0.0.1:{free_port()}",
               "--prefect-api-url", api, data=tmp_path)
    assert out.returncode == 1
    assert f"Prefect server at {api} does not answer" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "stack" / "stack.json").exists()


def test_resume_of_an_unknown_run_names_the_known_ones(tmp_path):
    from core.config import RunConfig

    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "config.json").write_text(RunConfig(run_id="r1").model_dump_json())
    out = _cli("resume", "nope", data=tmp_path)
    assert out.returncode == 1
    assert "no run 'nope'" in out.stderr and "known: r1" in out.stderr


def test_saved_config_resumes_without_fault_injection_and_with_more_steps(tmp_path, monkeypatch):
    from core.config import RunConfig
    from rose.resume import saved_run_config

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    cfg = RunConfig(run_id="r1", steps=3, seed=5, fault_injection={"train": 2})
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "config.json").write_text(cfg.model_dump_json())
    again = saved_run_config("r1", steps=8)
    assert again.fault_injection == {} and again.steps == 8 and again.seed == 5


def test_injected_train_fault_fires_once_per_run(tmp_path, monkeypatch):
    from core.config import RunConfig
    from tasks.train import InjectedFault, inject_fault

    monkeypatch.setenv("ROSE_DATA_DIR", str(tmp_path))
    cfg = RunConfig(run_id="r1", fault_injection={"train": 2})
    inject_fault(cfg, 1)  # another step: nothing
    with pytest.raises(InjectedFault, match="step 2"):
        inject_fault(cfg, 2)
    inject_fault(cfg, 2)  # the retry gets past it
