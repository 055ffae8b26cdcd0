"""Demonstrations: expert episodes with some noise, as text conversations.

They feed both the tokenizer (what text the model will see) and the warm-up (what the
policy should imitate). The noise (a random move in a fraction of turns) is deliberate:
it keeps the warmed-up policy mediocre, so RL has room to improve it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from envs.frozenlake import NAMES
from envs.registry import make_env


@dataclass
class Demo:
    env: str
    system: str
    turns: list[tuple[str, str]] = field(default_factory=list)  # (observation, reply)
    final: str = ""  # last observation, after the episode ended (never shown to the model)
    success: bool = False


def _noisy_reply(env, rng: np.random.Generator) -> str:
    if env.name == "guess":
        return str(int(rng.integers(env.lo, env.hi + 1)))  # a legal but non-halving guess
    return NAMES[int(rng.integers(4))]  # frozenlake and sokoban share the four moves


def demo_episode(env_name: str, seed: int, noise: float, rng: np.random.Generator) -> Demo:
    """One episode of env `env_name` from `seed`, acting expertly except in a `noise`
    fraction of turns."""
    env = make_env(env_name)
    obs = env.reset(seed)
    demo = Demo(env_name, env.system_prompt)
    while True:
        reply = _noisy_reply(env, rng) if rng.random() < noise else env.expert_reply()
        demo.turns.append((obs, reply))
        result = env.step(reply)
        if result.done:
            demo.final, demo.success = result.observation, bool(result.info["success"])
            return demo
        obs = result.observation


def demonstrations(episodes: dict[str, int], noise: float, seed: int) -> list[Demo]:
    """`episodes[env]` episodes per env, env seeds drawn from `seed` (disjoint from the small
    seeds evaluation uses), in a deterministic order."""
    rng = np.random.default_rng(seed)
    out = []
    for env_name in sorted(episodes):
        for _ in range(episodes[env_name]):
            out.append(demo_episode(env_name, int(rng.integers(10**6, 2**31)), noise, rng))
    return out


def corpus(demos: list[Demo]) -> list[str]:
    """Every text a chat made of these demos contains, for tokenizer training."""
    texts = []
    for d in demos:
        texts.append("system\n" + d.system)
        for obs, reply in d.turns:
            texts += ["user\n" + obs, "\n", "assistant\n", reply, "\n"]
        texts.append("user\n" + d.final)
    return texts
