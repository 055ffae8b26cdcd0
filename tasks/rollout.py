"""Rollout phase: every trajectory of the step, multi-turn, fanned out over rollout workers."""
from __future__ import annotations

import json
import logging
import math
import statistics
import time
from typing import Callable

from prefect import task

from envs.latency import StepLatency
from envs.registry import make_env
from executors.policies.dynamic_sampling import DynamicSampler
from executors.scheduling.episode import Episode
from executors.scheduling.group_launch import GroupLauncher
from executors.scheduling.remote_env import EnvHosts
from executors.scheduling.reward_service import RewardService, pool_usage
from executors.scheduling.scheduler import RolloutScheduler
from executors.coserving.plugin import start_coserving_step
from executors.workers.pinned import running_workers
from executors.workers.weight_sync import sync_weights
from core.config import RunConfig
from storage.atomic import write_atomic
from storage.trajectories.dataset import TrajectoryStore
from storage.trajectories.schema import trajectory_id
from tasks.borrow import borrow_for_step, claim_engines
from tasks.caching import STEP_CACHE
from tasks.placement import device_classes, require, workers_by_kind
from tasks.worker_threads import client_outside_thread_pool

log = logging.getLogger(__name__)


def env_seed(run_seed: int, step: int, group: int) -> int:
    """Trajectories of a group share their initial state; groups and steps differ."""
    return (run_seed * 1_000_003 + step * 1_009 + group) % (2**31)


def as_latency(config) -> StepLatency | None:
    """A StepLatencyConfig (rollout.env_step_latency, reward.cost) as envs/latency.py takes it."""
    return StepLatency(**config.model_dump()) if config else None


def group_factory(cfg: RunConfig, step: int, policy_version: int,
                  hosts: EnvHosts | None = None) -> Callable[[int], list[Episode]]:
    """make_group(g): the group_size trajectories of group g (one tokenizer for all groups);
    with `hosts`, each trajectory's environment lives on an environment worker."""
    from transformers import AutoTokenizer

    from core.chat import ChatTokens

    chat = ChatTokens(AutoTokenizer.from_pretrained(cfg.models.policy_path()))
    r = cfg.rollout
    latency = as_latency(r.env_step_latency)

    def make_group(g: int) -> list[Episode]:
        return [Episode(run=cfg.run_id, step=step, group=g, trajectory_id=trajectory_id(step, g, i),
                        env=(hosts.env(r.env, r.max_turns) if hosts is not None
                             else make_env(r.env, step_latency=latency, max_turns=r.max_turns)),
                        env_seed=env_seed(cfg.seed, step, g), chat=chat, max_turns=r.max_turns,
                        max_tokens=r.max_tokens_per_turn, temperature=r.temperature,
                        top_p=r.top_p, min_policy_version=policy_version)
                for i in range(r.group_size)]
    return make_group


def reward_service(client, cfg: RunConfig, step: int) -> RewardService:
    """The stack's elastic reward pool as this step's scorer (reward.service elastic or batch)."""
    return RewardService(client, cfg.run_id, lambda group: env_seed(cfg.seed, step, group),
                         cfg.rollout.max_turns, cost=as_latency(cfg.reward.cost), timeout_s=cfg.reward.timeout_s)


def reward_pool_state() -> dict | None:
    """The stack's reward pool controller's record (None: the stack has no reward pool)."""
    from core.config import stack_dir
    from coordination.reward_pool_state import read_pool_state

    return read_pool_state(stack_dir())


def require_reward_pool(cfg: RunConfig) -> None:
    """At the rollout's start: a run scoring on the pool fails at once on a stack without one."""
    if cfg.reward.service != "env" and reward_pool_state() is None:
        raise RuntimeError(f"reward.service {cfg.reward.service} scores trajectories on the stack's reward "
                           "pool, and this stack has none: start it with `rose up --reward-workers N` "
                           "(stack.reward_workers), or set reward.service: env")


def score_rows(service: RewardService, rows: list[dict], t0: float) -> dict:
    """Wait for every submitted trajectory's reward, write it into `rows`; the pool's summary."""
    got = service.collect()
    mismatches = RewardService.apply(rows, got)
    return {"mismatches": mismatches, **pool_usage(reward_pool_state(), got, t0, time.time())}


def env_hosts(client, kinds: dict[str, str], r) -> EnvHosts | None:
    """The stack's environment workers as the rollout's environment hosts (None: none, the
    environments step in this process)."""
    workers = sorted(n for n, k in kinds.items() if k == "env")
    if not workers:
        return None
    latency = as_latency(r.env_step_latency)
    return EnvHosts(client, workers, latency=latency, step_timeout_s=r.env_step_timeout_s)


def make_episodes(cfg: RunConfig, step: int, policy_version: int) -> list[Episode]:
    make_group = group_factory(cfg, step, policy_version)
    return [ep for g in range(cfg.rollout.groups) for ep in make_group(g)]


SAMPLING_FILE = "dynamic_sampling.json"  # in the run dir: the next step's launch target


def group_launcher(cfg: RunConfig, step: int, policy_version: int,
                   hosts: EnvHosts | None = None) -> GroupLauncher:
    """All groups at once, or DAPO dynamic sampling sized from the previous step's keep rate."""
    r, make_group = cfg.rollout, group_factory(cfg, step, policy_version, hosts)
    if not r.dynamic_sampling:
        return GroupLauncher(make_group, r.groups)
    max_launch = math.ceil(r.groups * r.dynamic_sampling_max_launch)
    launch = math.ceil(r.groups * r.dynamic_sampling_oversample)
    try:
        launch = int(json.loads((cfg.run_dir() / SAMPLING_FILE).read_text())["next_launch"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # first step (or unreadable): the configured oversampling
    launch = max(r.groups, min(max_launch, launch))
    return GroupLauncher(make_group, r.groups,
                         DynamicSampler(r.groups, launch, max_launch=max_launch))


def save_sampling(cfg: RunConfig, step: int, sampling: dict) -> None:
    if "next_step_launch" not in sampling:
        return
    path = cfg.run_dir() / SAMPLING_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"step": step, "next_launch": sampling["next_step_launch"],
                                   **sampling}))


def resync_from_relay(client, cfg: RunConfig, version: int):
    """A restarted (or stale) worker pulls the step's policy before it rejoins the rollout
    (sync_weights loads it into a co-serving executor's rollout engine on serving workers)."""
    def resync(name: str, kind: str):
        return client.submit(sync_weights, cfg.stack.relay, cfg.run_id, version,
                             cfg.publish.pull_batch_bytes,
                             sharded=cfg.publishes_sharded, workers=[name],
                             allow_other_workers=False, pure=False)
    return resync


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
        "rerouted_turns": report.rerouted_turns, "interrupted_turns": report.interrupted,
        "dead_workers": report.dead_workers,
        "excluded_workers": report.excluded_workers, "rejoined_workers": report.rejoined_workers,
        "aborted_turns": report.aborted_turns, "handed_back_turns": report.handed_back,
        "sampling": report.sampling,
        "worker_events": report.events,
        "scheduler_queued_s": sum(r["queued_s"] for r in rows),
        "rollout_s": report.seconds, "batches": report.batches,
        "by_kind": share_by_kind(rows),
    }


def share_by_kind(rows: list[dict]) -> dict[str, dict]:
    """Turns and tokens (prompt + response) per worker kind, and each kind's token share."""
    out: dict[str, dict] = {}
    for r in rows:
        k = out.setdefault(r["worker_kind"], {"turns": 0, "tokens": 0})
        k["turns"] += 1
        k["tokens"] += r["num_prompt_tokens"] + len(r["response_ids"])
    total = sum(k["tokens"] for k in out.values()) or 1
    for k in out.values():
        k["share"] = k["tokens"] / total
    return out


# Persisted and keyed by run/step/policy version: a resumed step reuses its trajectories.
@task(name="rollout", retries=1, retry_delay_seconds=2, cache_policy=STEP_CACHE,
      persist_result=True)
def rollout(cfg: RunConfig, step: int, policy_version: int) -> dict:
    """Generate the step's trajectories with policy `policy_version`; write them as Arrow."""
    r = cfg.rollout
    require_reward_pool(cfg)  # elastic or batch: before any turn is rolled out
    with client_outside_thread_pool() as client:
        kinds = workers_by_kind(client)
        require(kinds, "rollout")
        all_serving = sorted(n for n, k in kinds.items() if k == "serving")
        # this step's serving workers: leased to this run, lowest serving load first (tasks/borrow.py)
        grant = borrow_for_step(client, cfg, all_serving, policy_version) if r.borrow_serving else None
        lent = grant.workers if grant is not None else []
        # dedicated rollout workers may be shared with other runs: their engines load this run's
        # weights now (from host memory if held); a turn of this run never runs on another's
        dedicated = [n for n, k in kinds.items() if k == "rollout"]
        for name, why in claim_engines(client, cfg, dedicated, policy_version).items():
            log.warning("rollout worker %s: %s (its turns come back stale and resync)", name, why)
        workers = {n: k for n, k in kinds.items() if k == "rollout" or n in lent}
        # lent or not, a step window; never on a worker another run holds (its steps open them)
        serving = [n for n in all_serving if grant is None or n not in grant.held_elsewhere]
        # not awaited (an executor still starting must not hold up the rollout); held till the end
        # free and not lent to this run: parked (a worker given back or whose lease lapsed)
        idle_for = {n: cfg.run_id for n in serving if grant is not None and n not in lent}
        step_starts = [client.submit(start_coserving_step, idle_for.get(n), workers=[n],
                                     allow_other_workers=False, pure=False) for n in serving]
        incarnations = running_workers(client)  # a serving worker restarted meanwhile: new address
        scheduler = RolloutScheduler(client, workers, config=r,
                                     resync=resync_from_relay(client, cfg, policy_version),
                                     classes=device_classes(client) if r.hw_affinity else None)
        hosts = env_hosts(client, kinds, r)
        elastic = reward_service(client, cfg, step) if cfg.reward.service == "elastic" else None
        t0 = time.time()
        try:
            report = scheduler.run(group_launcher(cfg, step, policy_version, hosts),
                                   on_trajectory=(lambda ep: elastic.submit(ep.rows)) if elastic else None)
        finally:
            if hosts is not None:
                hosts.close()
        rewards = {}
        if elastic is not None:  # scored while the rollout went on; the surplus ones dropped
            kept = {ep.trajectory_id for ep in report.episodes}
            elastic.cancel([t for t in elastic.submitted if t not in kept])
            rewards = {"service": "elastic", **score_rows(elastic, report.rows, t0)}
        # a serving worker gone or still starting opens no window: never block the step on it
        live = running_workers(client)
        for name, started in zip(serving, step_starts):
            if live.get(name) != incarnations.get(name) and not started.done():
                started.cancel()  # died during the rollout (or restarted: its call went with it)
                log.warning("serving worker %s left during the rollout: no step window", name)
                continue
            try:
                started.result(timeout=30)
            except Exception as e:  # noqa: BLE001 - the step's trajectories matter more
                log.warning("serving worker %s did not start the step: %s", name, e)
    save_sampling(cfg, step, report.sampling)
    path = TrajectoryStore(cfg.trajectories_dir()).write_step(cfg.run_id, step, report.rows)
    return {**summarize(report, policy_version), "path": str(path),
            "env_hosts": hosts.summary() if hosts is not None else {}, "reward_service": rewards,
            "borrow": grant.as_dict() if grant is not None else {}}
