"""What an environment worker (kind `env`, resource env_cpu: CPU only) runs: environment
instances keyed by trajectory, created by `env_reset`, stepped by `env_step` with that
trajectory's replies in order, dropped when their episode ends or by `env_close`.

The instances live in this worker process between calls (Dask runs each call on one of the
worker's threads; a trajectory has at most one call in flight, so its instance is never shared).
A worker that dies takes its instances with it: the caller (executors/scheduling/remote_env.py)
rebuilds the trajectory's environment on another worker by replaying its replies.
"""
from __future__ import annotations

from envs.base import MultiTurnEnv, StepResult
from envs.latency import DelayedEnv, StepLatency
from envs.registry import make_env

_ENVS: dict[str, MultiTurnEnv] = {}  # trajectory id -> its environment, in this process


def env_reset(trajectory_id: str, name: str, seed: int, latency: StepLatency | None = None,
              max_turns: int | None = None, replay: tuple[str, ...] = ()) -> str:
    """A fresh environment for `trajectory_id`, reset to `seed`, with `replay` (its replies so
    far, in order) stepped again; the observation a caller would see next."""
    env = make_env(name, step_latency=None, max_turns=max_turns)  # replayed steps need no delay
    observation = env.reset(seed)
    for reply in replay:
        observation = env.step(reply).observation
    if latency is not None:  # the steps to come are delayed as configured
        env = DelayedEnv(env, latency)
    _ENVS[trajectory_id] = env
    return observation


def env_step(trajectory_id: str, reply: str) -> StepResult:
    """Step the trajectory's environment; the instance goes once its episode is over."""
    try:
        env = _ENVS[trajectory_id]
    except KeyError:
        raise LookupError(f"no environment for trajectory {trajectory_id} on this worker "
                          "(never reset here, or the worker restarted)") from None
    outcome = env.step(reply)
    if outcome.done:
        _ENVS.pop(trajectory_id, None)
    return outcome


def env_close(trajectory_ids: list[str]) -> int:
    """Drop these trajectories' environments (abandoned or finished elsewhere); how many were here."""
    return sum(_ENVS.pop(t, None) is not None for t in trajectory_ids)
