"""Held-out success: the policy plays a fixed set of maps (seeds 10^6..), one episode each, at
the run's temperature, in one in-process vLLM engine. Shared by the learning benches so every
configuration is scored on the same maps, which differ from every training map."""
from __future__ import annotations

from pathlib import Path

EVAL_SEED = 10**6


class HeldOut:
    """`with HeldOut(cfg) as h: h.success(weights)` (weights: HF names -> tensors, or None for
    the engine's current ones). `play` is also the bench's in-process rollout."""

    def __init__(self, cfg, maps: int = 32) -> None:
        from transformers import AutoTokenizer

        from executors.engine.vllm_engine import EngineLoop, EngineSpec
        from core.chat import ChatTokens

        self.cfg, self.maps = cfg, maps
        policy = Path(cfg.models.policy_path())
        self.chat = ChatTokens(AutoTokenizer.from_pretrained(policy))
        self.loop = EngineLoop(EngineSpec(policy, max_model_len=2048, seed=cfg.seed), "bench",
                               "rollout")

    def __enter__(self) -> "HeldOut":
        return self

    def __exit__(self, *exc) -> None:
        self.loop.close()

    def load(self, weights: dict) -> None:
        from executors.engine.vllm_engine import reload_weights

        self.loop.call(lambda engine: reload_weights(engine, weights))

    def play(self, step: int, groups: int, size: int, seed_of) -> list:
        from envs.registry import make_env
        from executors.scheduling.episode import Episode

        r = self.cfg.rollout
        episodes = [Episode(run=self.cfg.run_id, step=step, group=g,
                            trajectory_id=f"s{step}-g{g}-t{i}",
                            env=make_env(r.env, max_turns=r.max_turns), env_seed=seed_of(g),
                            chat=self.chat, max_turns=r.max_turns, max_tokens=r.max_tokens_per_turn,
                            temperature=r.temperature, top_p=r.top_p, min_policy_version=0)
                    for g in range(groups) for i in range(size)]
        live = episodes
        while live:  # one turn of every live trajectory per round, batched by the engine
            for ep, fut in [(ep, self.loop.submit(ep.request())) for ep in live]:
                ep.apply(fut.result())
            live = [ep for ep in live if not ep.done]
        return episodes

    def success(self, weights: dict | None = None) -> float:
        if weights is not None:
            self.load(weights)
        episodes = self.play(0, self.maps, 1, lambda g: EVAL_SEED + g)
        return sum(ep.succeeded for ep in episodes) / len(episodes)
