"""Environments on environment workers (an in-process Dask cluster with two env workers): a
remote trajectory sees what an in-process one sees; an instance lost with its worker (gone,
restarted) is rebuilt on the other worker by replaying the trajectory's replies, and counted."""
from __future__ import annotations

import pytest
from distributed import Client, Scheduler, SpecCluster, Worker

from envs.latency import StepLatency
from envs.registry import make_env
from executors.scheduling.remote_env import EnvHosts, EnvLost
from executors.workers.env_host import env_close
from tests.test_rollout_scheduler import TWO, FakeChat, scheduler
from tests.test_rollout_scheduler import cluster as rollout_cluster  # noqa: F401
from executors.scheduling.episode import Episode

REPLIES = ["Down", "Right", "Down", "Down", "Right", "Right", "Up", "Left"]


@pytest.fixture
def env_cluster():
    spec = {n: {"cls": Worker, "options": {"name": n, "nthreads": 2, "dashboard": False,
                                            "resources": {"env_cpu": 1}}} for n in ("env-0", "env-1")}
    with SpecCluster(workers=spec, scheduler={"cls": Scheduler, "options": {"dashboard_address": None}},
                     asynchronous=False) as c, Client(c) as client:
        yield c, client


def _play(env, seed: int = 3) -> list:
    out = [env.reset(seed)]
    for reply in REPLIES:
        r = env.step(reply)
        out.append((r.observation, r.reward, r.done, r.info.get("valid_action")))
        if r.done:
            break
    return out


def test_a_remote_trajectory_sees_what_an_in_process_one_sees(env_cluster):
    _, client = env_cluster
    hosts = EnvHosts(client, ["env-0", "env-1"])
    local, remote = make_env("frozenlake"), hosts.env("frozenlake")
    assert remote.name == local.name and remote.system_prompt == local.system_prompt and remote.blocking
    assert _play(remote) == _play(local)
    assert hosts.relaunches == 0 and remote.worker in ("env-0", "env-1")


def test_an_instance_lost_with_its_worker_is_rebuilt_elsewhere_by_replay(env_cluster):
    _, client = env_cluster
    hosts = EnvHosts(client, ["env-0", "env-1"], backoff_s=0.0)
    local, remote = make_env("frozenlake"), hosts.env("frozenlake")
    assert remote.reset(5) == local.reset(5)
    for reply in REPLIES[:2]:
        assert remote.step(reply) == local.step(reply)
    first = remote.worker
    # its worker restarted: the instance is gone there (the next step finds none)
    assert client.submit(env_close, [remote.key], workers=[first], pure=False).result() == 1
    r = remote.step(REPLIES[2])
    assert r == local.step(REPLIES[2])
    assert remote.worker != first and hosts.relaunches == 1 and hosts.failed_on == {first: 1}


def test_a_step_for_a_worker_that_left_is_relaunched_elsewhere(env_cluster):
    c, client = env_cluster
    hosts = EnvHosts(client, ["env-0", "env-1"], step_timeout_s=2.0, backoff_s=0.0)
    local, remote = make_env("frozenlake"), hosts.env("frozenlake")
    remote.reset(7), local.reset(7)
    first = remote.worker
    client.retire_workers(names=[first], close_workers=True)  # its steps can go nowhere now
    assert remote.step("Down") == local.step("Down")
    assert remote.worker != first and hosts.relaunches == 1


@pytest.mark.timeout(60)  # without the check, the step would wait out its 600 s timeout
def test_a_step_in_flight_when_its_worker_dies_is_relaunched_without_waiting_out_the_timeout(env_cluster):
    """Dask leaves such a step `no-worker` for good (its restriction names the dead incarnation):
    the hosts notice the worker gone within a poll interval and relaunch the trajectory."""
    import threading

    c, client = env_cluster
    hosts = EnvHosts(client, ["env-0", "env-1"], latency=StepLatency(mean_s=3.0), step_timeout_s=600.0,
                     backoff_s=0.0, poll_s=0.2)
    local, remote = make_env("frozenlake"), hosts.env("frozenlake")
    remote.reset(7), local.reset(7)
    first = remote.worker
    stepped: list = []
    stepping = threading.Thread(target=lambda: stepped.append(remote.step("Down")))
    stepping.start()
    while not any(client.processing(workers=[first]).values()):  # the step is running there
        stepping.join(timeout=0.05)
    c.sync(c.workers[first].close)
    stepping.join()
    assert stepped == [local.step("Down")]
    assert remote.worker != first and hosts.relaunches == 1 and hosts.failed_on == {first: 1}


def test_a_probe_the_scheduler_cannot_answer_leaves_the_steps_to_their_timeout(env_cluster, monkeypatch):
    """Where asking the scheduler for the workers' addresses fails (stood in for: this
    distributed version answers; another could lack the fields), the dead-worker check is off,
    said once; the steps run as before."""
    _, client = env_cluster

    def refuse(*_, **__):
        raise AttributeError("'WorkerState' object has no attribute 'name'")

    monkeypatch.setattr(client, "run_on_scheduler", refuse)
    hosts = EnvHosts(client, ["env-0", "env-1"], latency=StepLatency(mean_s=0.5), poll_s=0.1)
    local, remote = make_env("frozenlake"), hosts.env("frozenlake")
    assert _play(remote) == _play(local)
    assert not hosts.probing and hosts.relaunches == 0


def test_no_worker_left_is_an_error_that_names_the_environment(env_cluster):
    _, client = env_cluster
    hosts = EnvHosts(client, ["env-8", "env-9"], step_timeout_s=1.0, attempts=2, backoff_s=0.0)
    remote = hosts.env("frozenlake")  # named workers that are not (any more) in the cluster
    with pytest.raises(EnvLost, match="frozenlake environment .* failed on 2 attempts"):
        remote.reset(1)
    assert hosts.failed_on == {"env-8": 1, "env-9": 1}
    with pytest.raises(ValueError, match="no environment workers"):
        EnvHosts(client, [])


def test_the_scheduler_runs_trajectories_on_environment_workers(rollout_cluster):  # noqa: F811
    c, client = rollout_cluster  # it has no environment worker: add two
    for name in ("env-0", "env-1"):
        c.worker_spec[name] = {"cls": Worker, "options": {"name": name, "nthreads": 2, "dashboard": False}}
    c.scale(len(c.worker_spec))
    client.wait_for_workers(len(c.worker_spec))
    hosts = EnvHosts(client, ["env-0", "env-1"])
    eps = [Episode(run="t", step=1, group=0, trajectory_id=f"s1-g0-t{i}", env=hosts.env("guess", 3),
                   env_seed=i, chat=FakeChat(), max_turns=3, max_tokens=4, temperature=1.0, top_p=1.0,
                   min_policy_version=0) for i in range(4)]
    report = scheduler(client, TWO).run(eps)
    assert len(report.episodes) == 4 and all(ep.done for ep in report.episodes)
    assert {r["env"] for r in report.rows} == {"guess"}
    assert hosts.close() == 0  # every episode ended: nothing left on the workers
    keys = [ep.env.key for ep in eps]
    assert sum(client.run(env_close, keys).values()) == 0  # dropped by their last step


def test_the_stack_starts_environment_workers_with_their_resource():
    from core.config import StackConfig
    from rose.stack.dask_cluster import worker_specs
    from core.worker_kinds import KIND_OF_RESOURCE

    envs = [s for s in worker_specs(1, 1, 0, env=2) if s.kind == "env"]
    assert [s.name for s in envs] == ["env-0", "env-1"]
    assert all(KIND_OF_RESOURCE[s.resources.split("=")[0]] == "env" and s.core is None for s in envs)
    assert not [s for s in worker_specs(1, 1, 0) if s.kind == "env"]  # none unless asked for
    assert StackConfig(env_workers=3).env_workers == 3
    with pytest.raises(ValueError, match="env_workers"):
        StackConfig(env_workers=-1)


@pytest.mark.slow
def test_an_environment_worker_killed_mid_trajectory_loses_nothing(tmp_path):
    """Two environment worker processes as the stack starts them (`dask worker --nanny`, env_cpu):
    the one holding a trajectory's environment is SIGKILLed mid-trajectory (its nanny restarts
    it, empty); the trajectory goes on with what an in-process environment gives."""
    import contextlib
    import os
    import signal

    import psutil

    from rose.stack.dask_cluster import start_dask, worker_specs

    cluster = start_dask(tmp_path, worker_specs(0, 0, 0, env=2), {})
    try:
        with Client(cluster.scheduler_address) as client:
            hosts = EnvHosts(client, ["env-0", "env-1"], step_timeout_s=20.0, backoff_s=0.1)
            local, remote = make_env("sokoban_easy"), hosts.env("sokoban_easy")
            assert remote.reset(0) == local.reset(0)
            replies = ["Left", "Right"] * 4  # valid moves that neither solve nor end seed 0
            assert remote.step(replies[0]) == local.step(replies[0])
            victim = remote.worker
            pids = client.run(os.getpid)
            [pid] = [p for addr, p in pids.items()
                     if client.scheduler_info()["workers"][addr]["name"] == victim]
            os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).wait(timeout=10)  # gone before the next step is sent
            for reply in replies[1:]:
                assert remote.step(reply) == local.step(reply)
            assert hosts.relaunches == 1 and hosts.failed_on == {victim: 1}
    finally:
        cluster.stop()
