"""Reward phase: trajectory rewards -> GRPO group advantages, written back to the step's rows."""
from __future__ import annotations

import time

import torch
from prefect import task

from core.config import RunConfig
from core.grpo import group_advantages
from storage.trajectories.dataset import TrajectoryStore
from tasks.caching import STEP_CACHE
from tasks.rollout import require_reward_pool, reward_service, score_rows
from tasks.worker_threads import client_outside_thread_pool


def advantages_by_trajectory(rows: list[dict]) -> dict[str, float]:
    """Group-normalised advantage per trajectory (groups share their initial state)."""
    reward: dict[str, float] = {}
    group_of: dict[str, int] = {}
    for r in rows:
        reward[r["trajectory"]] = r["trajectory_reward"]
        group_of[r["trajectory"]] = r["group"]
    groups: dict[int, list[str]] = {}
    for tid in sorted(reward):
        groups.setdefault(group_of[tid], []).append(tid)
    sizes = {len(t) for t in groups.values()}
    if len(sizes) != 1:
        raise ValueError(f"groups have unequal sizes {sorted(sizes)}: a trajectory is missing")
    order = [groups[g] for g in sorted(groups)]
    adv = group_advantages(torch.tensor([[reward[t] for t in ts] for ts in order],
                                        dtype=torch.float64))
    return {t: float(adv[i, j]) for i, ts in enumerate(order) for j, t in enumerate(ts)}


@task(name="reward", retries=2, retry_delay_seconds=1, cache_policy=STEP_CACHE,
      persist_result=True)
def reward(cfg: RunConfig, step: int) -> dict:
    store = TrajectoryStore(cfg.trajectories_dir())
    rows = store.read_step(cfg.run_id, step).to_pylist()
    service = {}
    if cfg.reward.service == "batch":  # the baseline: every trajectory scored after the rollout
        require_reward_pool(cfg)  # a cached rollout skipped the rollout task's check
        by_trajectory: dict[str, list[dict]] = {}
        for r in sorted(rows, key=lambda r: (r["trajectory"], r["turn"])):
            by_trajectory.setdefault(r["trajectory"], []).append(r)
        with client_outside_thread_pool() as client:
            scorer, t0 = reward_service(client, cfg, step), time.time()
            for turns in by_trajectory.values():
                scorer.submit(turns)
            service = {"service": "batch", **score_rows(scorer, rows, t0)}
    adv = advantages_by_trajectory(rows)
    for r in rows:
        r["advantage"] = adv[r["trajectory"]]
    store.write_step(cfg.run_id, step, rows)
    informative = sum(1 for a in adv.values() if a != 0.0)
    return {"trajectories": len(adv), "informative_trajectories": informative, "reward_service": service}
