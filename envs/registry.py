"""Environments by name, as the run configuration spells them."""
from __future__ import annotations

from envs.base import MultiTurnEnv
from envs.frozenlake import FrozenLakeEnv
from envs.guess import GuessEnv

ENVS: dict[str, type[MultiTurnEnv]] = {"frozenlake": FrozenLakeEnv, "guess": GuessEnv}


def make_env(name: str, **kwargs) -> MultiTurnEnv:
    """A fresh environment; kwargs (e.g. max_turns) go to its constructor."""
    try:
        cls = ENVS[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(ENVS))}") from None
    return cls(**kwargs)
