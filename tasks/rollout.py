"""Rollout phase: every trajectory of the step, multi-turn, fanned out over rollout workers."""
from __future__ import annotations

import statistics

from distributed import worker_client
from prefect import task

from envs.registry import make_env
from executors.episode import Episode
from executors.rollout_scheduler import RolloutScheduler
from rose.config import RunConfig
from storage.trajectories import TrajectoryStore
from storage.trajectory_schema import trajectory_id
from tasks.caching import STEP_CACHE
from tasks.placement import require, workers_by_kind


def env_seed(run_seed: int, step: int, group: int) -> int:
    """Trajectories of a group share their initial state; groups and steps differ."""
    return (run_seed * 1_000_003 + step * 1_009 + group) % (2**31)


def make_episodes(cfg: RunConfig, step: int, policy_version: int) -> list[Episode]:
    from transformers import AutoTokenizer

    from rose.models.chat import ChatTokens

    chat = ChatTokens(AutoTokenizer.from_pretrained(cfg.models.policy_path()))
    r = cfg.rollout
    return [Episode(run=cfg.run_id, step=step, group=g, trajectory_id=trajectory_id(step, g, i),
                    env=make_env(r.env, max_turns=r.max_turns),
                    env_seed=env_seed(cfg.seed, step, g), chat=chat, max_turns=r.max_turns,
                    max_tokens=r.max_tokens_per_turn, temperature=r.temperature, top_p=r.top_p,
                    min_policy_version=policy_version)
            for g in range(r.groups) for i in range(r.group_size)]


def summarize(report, policy_version: int) -> dict:
    rows = report.rows
    prompt_tokens = sum(r["num_prompt_tokens"] for r in rows)
    traj_rewards = [ep.rows[-1]["trajectory_reward"] for ep in report.episodes]
    return {
        "trajectories": len(report.episodes), "turns": len(rows),
        "policy_version": policy_version,
        "success_rate": sum(ep.succeeded for ep in report.episodes) / len(report.episodes),
        "mean_reward": statistics.fmean(traj_rewards),
        "input_tokens": prompt_tokens,
        "output_tokens": sum(len(r["response_ids"]) for r in rows),
        "cached_tokens": sum(r["num_cached_tokens"] for r in rows),
        "prefix_cache_hit_rate": sum(r["num_cached_tokens"] for r in rows) / max(1, prompt_tokens),
        "invalid_turns": sum(r["status"] == "invalid_action" for r in rows),
        "rerouted_turns": report.rerouted_turns, "dead_workers": report.dead_workers,
        "rollout_s": report.seconds, "batches": report.batches,
    }


# Persisted and keyed by run/step/policy version: a resumed step reuses its trajectories.
@task(name="rollout", retries=1, retry_delay_seconds=2, cache_policy=STEP_CACHE,
      persist_result=True)
def rollout(cfg: RunConfig, step: int, policy_version: int) -> dict:
    """Generate the step's trajectories with policy `policy_version`; write them as Arrow."""
    with worker_client() as client:
        kinds = workers_by_kind(client)
        workers = {n: k for n, k in kinds.items() if k == "rollout"}
        require(kinds, "rollout")
        scheduler = RolloutScheduler(client, workers, cfg.rollout.max_concurrency_per_worker)
        report = scheduler.run(make_episodes(cfg, step, policy_version))
    path = TrajectoryStore(cfg.trajectories_dir()).write_step(cfg.run_id, step, report.rows)
    return {**summarize(report, policy_version), "path": str(path)}
