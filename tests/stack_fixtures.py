"""Helpers for slow tests that run a real local stack in their own data directory.

Models are built once per pytest session (under its base temp dir, or taken from
ROSE_TEST_MODELS_DIR) and linked into each test's data directory. Prefect reads its settings
once per process, so everything that talks to a stack's server goes through `prefect_for`.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


_BACKGROUND_BUILD: list[tuple[subprocess.Popen, Path]] = []  # (build process, its log)


def build_models_into(root: str | Path) -> None:
    """The product's model build, into root/policy and root/serving (skipped when built)."""
    from core.config import ModelsConfig
    from rose.models.build import build_models

    root = Path(root)
    build_models(ModelsConfig(policy_dir=root / "policy", serving_dir=root / "serving"))


def start_model_build(tmp_path_factory) -> None:
    """Build the session's models in a process of their own now: one thread, so they take the
    core the fast tests leave idle, and are ready when the first end-to-end test asks."""
    if os.environ.get("ROSE_TEST_MODELS_DIR") or _BACKGROUND_BUILD:
        return
    root = tmp_path_factory.getbasetemp() / "rose-models"
    log = tmp_path_factory.getbasetemp() / "rose-models-build.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.stack_fixtures", str(root)],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    _BACKGROUND_BUILD.append((proc, log))


def stop_model_build() -> None:
    """At the session's end: a background build no test waited for (a session of fast tests
    that only collected slow ones, a -k selection, an early stop) must not outlive pytest."""
    for proc, _ in _BACKGROUND_BUILD:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def shared_models(tmp_path_factory) -> Path:
    given = os.environ.get("ROSE_TEST_MODELS_DIR")
    if given:
        return Path(given)
    for proc, log in _BACKGROUND_BUILD:
        if proc.wait() != 0:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the background model build failed (code {proc.returncode}):\n{tail}")
    root = tmp_path_factory.getbasetemp() / "rose-models"
    build_models_into(root)  # a no-op after the background build
    return root


def new_data_dir(tmp_path_factory, name: str) -> Path:
    data = tmp_path_factory.mktemp(name)
    (data / "models").symlink_to(shared_models(tmp_path_factory), target_is_directory=True)
    return data


@contextmanager
def prefect_for(handle):
    """Prefect client settings pointing at this stack's server (whatever was imported before)."""
    from prefect.settings import (PREFECT_API_URL, PREFECT_HOME,
                                  PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings)

    # Flows run in this process; Dask workers take the results path from its settings.
    with temporary_settings(updates={
            PREFECT_API_URL: handle.prefect_api_url, PREFECT_HOME: handle.prefect_home,
            PREFECT_RESULTS_LOCAL_STORAGE_PATH: Path(handle.prefect_home) / "storage"}):
        yield


def drain_prefect_services(timeout_s: float = 60.0) -> None:
    """Deliver this process's queued Prefect events and logs to the stack's server while it is
    still up, and retire the services. Prefect keeps one events worker per process, not per API
    URL: left alone, it holds events for this stack's server after the server is gone, and the
    next `prefect_test_harness()` blocks on exit delivering them (a 60 s client timeout each;
    a full run sat in test_cluster_sim_flow's harness exit for 10+ minutes)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=timeout_s, at_exit=False)


@contextmanager
def in_process_stack(tmp_path_factory, name: str, stopped: list | None = None,
                     config: Any = None):
    """A local stack (`config`, a StackConfig; default 1 rollout worker) in its own data
    directory with the session's models, set up for flows run in this process; on exit it is
    stopped (what stop_stack stopped goes into `stopped`) and the environment restored."""
    old = dict(os.environ)
    os.environ["ROSE_DATA_DIR"] = str(new_data_dir(tmp_path_factory, name))
    from core.config import StackConfig, stack_dir
    from rose.stack.local_stack import apply_env, stack_env, start_stack, stop_stack

    handle = start_stack(config or StackConfig(rollout_workers=1), stack_dir())
    apply_env(stack_env(handle))
    try:
        with prefect_for(handle):
            try:
                yield handle
            finally:
                drain_prefect_services()
    finally:
        (stopped if stopped is not None else []).extend(stop_stack(stack_dir()))
        os.environ.clear()
        os.environ.update(old)


class SharedStack:
    """One local stack (a trainer, a rollout worker, an environment worker, the Mooncake relay)
    for the end-to-end modules that only run flows on it, each its own run: started by the first
    test that asks, stopped after the last (tests/conftest.py counts them), then `after_stop`
    checks run with what stop_stack stopped."""

    def __init__(self, tmp_path_factory) -> None:
        self._factory, self._exit = tmp_path_factory, None
        self.handle: Any = None
        self.stopped: list[str] = []
        self._checks: list = []

    def start(self) -> Any:
        if self.handle is None:
            from core.config import StackConfig

            self._exit = ExitStack()
            self.handle = self._exit.enter_context(in_process_stack(
                self._factory, "rose-shared", self.stopped,
                # environment workers: these runs' environments step there (RemoteEnv); a
                # reward pool of at most one worker, none while idle (rose/stack/reward_pool.py)
                config=StackConfig(rollout_workers=1, relay="mooncake", env_workers=2,
                                   reward_workers=1, reward_threads=8)))
        return self.handle

    def after_stop(self, check) -> None:
        self._checks.append(check)

    def stop(self) -> None:
        if self._exit is None:
            return
        exit_stack, self._exit, self.handle = self._exit, None, None
        exit_stack.close()
        checks, self._checks = self._checks, []
        for check in checks:
            check(self.stopped)


@dataclass
class FlowRunInfo:
    run: Any  # prefect FlowRun
    tasks: list  # its task runs

    @property
    def state(self):
        return self.run.state


def flow_runs(name: str) -> list[FlowRunInfo]:
    """Flow runs with this name, oldest first, each with its task runs."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterName,
                                                TaskRunFilter, TaskRunFilterFlowRunId)
    from prefect.client.schemas.sorting import FlowRunSort

    async def fetch():
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])),
                sort=FlowRunSort.START_TIME_ASC)
            return [FlowRunInfo(run, await client.read_task_runs(task_run_filter=TaskRunFilter(
                flow_run_id=TaskRunFilterFlowRunId(any_=[run.id])))) for run in runs]

    return asyncio.run(fetch())


PHASES = ("rollout", "reward", "train", "publish")


def task_states(run) -> dict[str, str]:
    """phase -> state name ("Cached", "Completed", "Failed") of one rl_step flow run's RL phases
    (its serving-report task, which reads the serving workers' window, is left out)."""
    states = {t.name.rsplit("-", 1)[0]: t.state.name for t in run.tasks}
    return {phase: state for phase, state in states.items() if phase in PHASES}


def file_fingerprint(path: Path) -> tuple[int, str]:
    return path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


def rose_cli(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """`rose ...` as a user runs it (own process, so its Prefect settings are its own)."""
    return subprocess.run([sys.executable, "-m", "rose.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@contextmanager
def cli_stack_env(data: Path):
    """(env for `rose` CLI processes) with ROSE_DATA_DIR=data here too, for in-process readers
    (stack.json, Arrow); on exit this process's Prefect events are delivered while the stack's
    server is up (flows run in-process by a test), the stack is stopped and the environment
    restored (a test may have applied the stack's env). Other stacks' Prefect/Mooncake/relay
    settings are left out of the CLI env."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_", "ROSE_MOONCAKE", "ROSE_RELAY"))}
    env["ROSE_DATA_DIR"] = str(data)
    old = dict(os.environ)
    os.environ["ROSE_DATA_DIR"] = str(data)
    try:
        yield env
    finally:
        drain_prefect_services()
        rose_cli(["down"], env, timeout=120)
        os.environ.clear()
        os.environ.update(old)


def trainer_and_worker_state(scheduler: str, run_id: str) -> tuple[dict, dict]:
    """(trainer version + bf16 digest, rollout-0's version + digest) from the live workers."""
    from distributed import Client

    from executors.workers.rollout_worker import worker_state
    from storage.weights.digest import tensors_digest
    from executors.workers.trainer import local_trainer

    def trainer_state(run):
        t = local_trainer(run)
        return {"version": t.version, "digest": tensors_digest(t.weights_bf16())}

    with Client(scheduler) as client:
        trainer = client.submit(trainer_state, run_id, resources={"train_gpu": 1},
                                pure=False).result()
        worker = client.submit(worker_state, workers=["rollout-0"], pure=False).result()
    return trainer, worker


def engine_mismatches(scheduler: str, run_id: str, worker: str = "rollout-0",
                      trainer_weights: dict | None = None) -> list[str]:
    """Names of the weights on which `worker`'s vLLM engine (read from the engine, packed GEMM
    copies included) differs from the trainer's bf16 weights (`trainer_weights`, else the one
    trainer process's): [] means bit-identical."""
    from distributed import Client

    from executors.engine.weights_view import HEAD
    from executors.workers.rollout_worker import engine_weight_digests, weight_digests
    from executors.workers.trainer import local_trainer

    with Client(scheduler) as client:
        engine = client.submit(engine_weight_digests, workers=[worker], pure=False).result()
        if trainer_weights is not None:
            trained = weight_digests(trainer_weights)
        else:
            trained = client.submit(lambda run: weight_digests(local_trainer(run).weights_bf16()),
                                    run_id, resources={"train_gpu": 1}, pure=False).result()
    if HEAD not in trained:  # a tied head: the engine's GEMM copy must equal the embeddings
        trained[HEAD] = trained["model.embed_tokens.weight"]
    return [n for n in sorted(set(engine) | set(trained)) if engine.get(n) != trained.get(n)]


if __name__ == "__main__":  # `python -m tests.stack_fixtures DIR`: the test models, built ahead (Makefile)
    build_models_into(sys.argv[1])
