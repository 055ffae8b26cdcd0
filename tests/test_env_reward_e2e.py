"""RollArt's setting end to end on the shared stack: two RL steps of Sokoban whose environments
step on the stack's environment workers, every trajectory scored on the elastic reward pool as
soon as it ends, and the environment worker holding trajectories SIGKILLed in the middle of the
first step's rollout: no trajectory is lost (each is relaunched on the other worker by replay),
and every reward the pool gives is the one the environment gave."""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest
from distributed import Client

pytestmark = [pytest.mark.slow, pytest.mark.models]


@pytest.fixture(scope="module")
def stack(shared_stack):
    return shared_stack.handle


def _kill_env_worker_mid_step(scheduler: str, victim: str, killed: dict, stop: threading.Event) -> None:
    """SIGKILL `victim`'s worker process (its nanny starts it again, empty) once it holds
    environments, i.e. in the middle of a rollout."""
    def _held_environments() -> int:  # nested: pickled by value (workers cannot import tests/)
        from executors.workers.env_host import _ENVS

        return len(_ENVS)

    with Client(scheduler) as client:
        while not stop.is_set():
            workers = client.scheduler_info(n_workers=-1)["workers"]
            [addr] = [a for a, w in workers.items() if w["name"] == victim] or [None]
            if addr is not None and client.run(_held_environments, workers=[addr])[addr] > 0:
                pid = client.run(os.getpid, workers=[addr])[addr]
                os.kill(pid, signal.SIGKILL)
                killed.update(pid=pid, at=time.time())
                return
            time.sleep(0.1)


def test_sokoban_on_env_workers_with_elastic_reward_survives_a_killed_env_worker(stack):
    from flows.train import train
    from core.config import RunConfig
    from storage.trajectories.dataset import TrajectoryStore

    run = f"env-reward-{uuid.uuid4().hex[:6]}"
    cfg = RunConfig.model_validate({
        "run_id": run, "steps": 2, "models": {"demo_envs": ["frozenlake", "guess", "sokoban_easy"]},
        "rollout": {"env": "sokoban_easy", "groups": 2, "group_size": 4, "max_turns": 6,
                    # slow steps, as RollArt's environments are: the kill lands mid-trajectory
                    "env_step_latency": {"mean_s": 0.1, "std_s": 0.05}},
        "reward": {"service": "elastic"}})
    killed: dict = {}
    stop = threading.Event()
    killer = threading.Thread(target=_kill_env_worker_mid_step, args=(stack.dask_scheduler, "env-0", killed, stop))
    killer.start()
    try:
        summaries = train(cfg)
    finally:
        stop.set()
        killer.join(timeout=30)
    assert killed, "env-0 never held an environment: nothing was killed"
    assert [s["step"] for s in summaries] == [1, 2]
    first = summaries[0]
    assert first["env_hosts"]["relaunches"] >= 1 and first["env_hosts"]["failed_on"].get("env-0", 0) >= 1, first
    store = TrajectoryStore(cfg.trajectories_dir())
    for s in summaries:
        assert s["trajectories"] == 8, s  # none lost
        pool = s["reward_service"]
        assert pool["service"] == "elastic" and pool["trajectories"] == 8 and pool["mismatches"] == 0, pool
        rows = store.read_step(run, s["step"]).to_pylist()
        ends = {r["trajectory"]: r for r in rows if r["done"]}
        assert len(ends) == 8  # every trajectory ran to its end
        assert all(r["env"] == "sokoban_easy" for r in rows)
        for tid, last in ends.items():  # the pool's reward is the environment's own sum
            assert last["trajectory_reward"] == pytest.approx(sum(r["reward"] for r in rows if r["trajectory"] == tid))
