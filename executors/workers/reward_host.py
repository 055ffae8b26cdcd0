"""What a reward worker (kind `reward`, resource reward_cpu: CPU only) runs: one trajectory's
reward, scored as soon as the trajectory ends, statelessly.

The reward is the environment's own verifier run again from the trajectory alone: a fresh
environment reset to the trajectory's seed, its replies stepped in order, the rewards summed.
The rollout's environment (in the driver or on an environment worker) is not trusted for it,
and nothing of the rollout's state is needed, so any worker of the pool can score any
trajectory of any run. `cost` stands for a reward model's time per trajectory (a judge on a
GPU takes seconds; the verifiers here take microseconds), drawn per trajectory, for benchmarks.
"""
from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass

import numpy as np

from envs.latency import StepLatency
from envs.registry import make_env


@dataclass(frozen=True)
class RewardJob:
    run: str
    trajectory_id: str
    env: str
    seed: int
    replies: tuple[str, ...]
    max_turns: int
    submitted: float  # time.time() when the driver sent it: queueing is measured across hosts
    cost: StepLatency | None = None


@dataclass(frozen=True)
class RewardResult:
    trajectory_id: str
    reward: float
    success: bool
    worker: str
    submitted: float
    started: float
    finished: float


def score_trajectory(job: RewardJob) -> RewardResult:
    """The trajectory's summed environment reward, from its seed and replies."""
    started = time.time()
    env = make_env(job.env, step_latency=None, max_turns=job.max_turns)
    env.reset(job.seed)
    total, success = 0.0, False
    for reply in job.replies:
        outcome = env.step(reply)
        total += float(outcome.reward)
        success = bool(outcome.info.get("success", False))
        if outcome.done:
            break
    if job.cost is not None:
        delay = job.cost.draw(np.random.default_rng(zlib.crc32(job.trajectory_id.encode())))
        if delay > 0:
            time.sleep(delay)
    worker = os.environ.get("ROSE_WORKER_NAME", "local")
    return RewardResult(job.trajectory_id, total, success, worker, job.submitted, started, time.time())
