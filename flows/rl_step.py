"""One RL step as a Prefect flow: rollout -> reward -> train -> publish.

Each task runs on a Dask worker standing for a GPU (pinned by resource); fine-grained work
(turns, weight pulls) fans out from inside the tasks as plain Dask futures.
"""
from __future__ import annotations

import time

import dask
from prefect import flow

from dashboards.events import emit
from rose.config import RunConfig
from tasks.publish import publish
from tasks.reward import reward
from tasks.rollout import rollout
from tasks.train import train

ON_TRAINER = {"resources": {"train_gpu": 1}}  # drivers and trainer state live on the trainer


def _phase(name: str, step: int, submit):
    emit("phase_start", step=step, phase=name)
    t0 = time.perf_counter()
    with dask.annotate(**ON_TRAINER):
        future = submit()
    result = future.result()
    seconds = time.perf_counter() - t0
    emit("phase_end", step=step, phase=name, seconds=seconds, result=result)
    return result, seconds


@flow(name="rl_step", flow_run_name="{cfg.run_id}-step-{step}", log_prints=True)
def rl_step(cfg: RunConfig, step: int) -> dict:
    """Advance the policy from version step-1 to version step."""
    t0 = time.perf_counter()
    rolled, rollout_s = _phase("rollout", step, lambda: rollout.submit(cfg, step, step - 1))
    rewarded, reward_s = _phase("reward", step, lambda: reward.submit(cfg, step))
    trained, train_s = _phase("train", step, lambda: train.submit(cfg, step))
    published, publish_s = _phase("publish", step, lambda: publish.submit(cfg, step))
    step_s = time.perf_counter() - t0
    tokens = rolled["input_tokens"] + rolled["output_tokens"]
    summary = {
        "step": step, "reward": rolled["mean_reward"], "success_rate": rolled["success_rate"],
        "trajectories": rolled["trajectories"], "turns": rolled["turns"], "tokens": tokens,
        "output_tokens": rolled["output_tokens"],
        "prefix_cache_hit_rate": rolled["prefix_cache_hit_rate"],
        "rollout_s": rollout_s, "reward_s": reward_s, "train_s": train_s,
        "publish_s": publish_s, "step_s": step_s, "tokens_per_s": tokens / step_s,
        "loss": trained.get("loss", 0.0), "grad_norm": trained.get("grad_norm", 0.0),
        "informative": rewarded["informative_trajectories"],
        "publish_bytes": published["bytes"], "policy_version": published["version"],
        "arrow_path": rolled["path"], "rerouted_turns": rolled["rerouted_turns"],
        "engine_rollout_s": rolled["rollout_s"], "engine_train_s": trained.get("train_s", 0.0),
    }
    emit("step_end", **summary)
    return summary
