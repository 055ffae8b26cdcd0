"""Environments by name, as the run configuration spells them."""
from __future__ import annotations

from envs.base import MultiTurnEnv
from envs.frozenlake import FrozenLakeEnv
from envs.guess import GuessEnv
from envs.latency import DelayedEnv, StepLatency
from envs.sokoban import EasySokobanEnv, SokobanEnv

ENVS: dict[str, type[MultiTurnEnv]] = {"frozenlake": FrozenLakeEnv, "guess": GuessEnv, "sokoban": SokobanEnv,
                                       "sokoban_easy": EasySokobanEnv}


def make_env(name: str, step_latency: StepLatency | None = None, **kwargs) -> MultiTurnEnv:
    """A fresh environment; kwargs (e.g. max_turns) go to its constructor. With `step_latency`,
    each step sleeps a duration drawn from it first (envs/latency.py)."""
    try:
        cls = ENVS[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(ENVS))}") from None
    env = cls(**kwargs)
    return env if step_latency is None else DelayedEnv(env, step_latency)
