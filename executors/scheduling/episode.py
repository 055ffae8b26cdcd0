"""One trajectory in progress: the environment, the growing token list, and its turn rows."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from envs.base import MultiTurnEnv, StepResult
from executors.turns import TurnRequest, TurnResult
from core.chat import ChatTokens


class Episode:
    def __init__(self, *, run: str, step: int, group: int, trajectory_id: str,
                 env: MultiTurnEnv, env_seed: int, chat: ChatTokens, max_turns: int,
                 max_tokens: int, temperature: float, top_p: float, min_policy_version: int):
        self.run, self.step, self.group, self.trajectory_id = run, step, group, trajectory_id
        self.env, self.chat = env, chat
        self.max_turns, self.max_tokens = max_turns, max_tokens
        self.temperature, self.top_p = temperature, top_p
        self.min_policy_version = min_policy_version
        observation = env.reset(env_seed)
        self.tokens: list[int] = chat.system(env.system_prompt) + chat.user_turn(observation)
        self.turn = 0
        self.attempt = 0
        self.returned = 0  # attempts a worker handed back before running (not failures)
        self.rows: list[dict] = []
        self.done = False
        self.rerouted = False
        self.succeeded = False
        self.ready_since = time.monotonic()
        self.scheduler_wait_s = 0.0  # ready -> dispatched, for the attempt that ran

    def request(self) -> TurnRequest:
        """The next turn's request; the time it waited in the scheduler's queue is noted here."""
        self.attempt += 1
        self.scheduler_wait_s = max(0.0, time.monotonic() - self.ready_since)
        return TurnRequest(f"{self.trajectory_id}/t{self.turn}/a{self.attempt}", self.trajectory_id,
                           list(self.tokens), self.max_tokens, self.temperature, self.top_p,
                           stop_token_ids=[self.chat.eos_id],
                           min_policy_version=self.min_policy_version, run=self.run)

    def give_back(self, unstarted: bool = False) -> None:
        """The turn was lost (worker died, aborted, stale) or handed back before it started
        (`unstarted`: that attempt is not a failure): it will be re-prefilled elsewhere."""
        self.returned += unstarted
        self.rerouted = True
        self.ready_since = time.monotonic()

    def apply(self, result: TurnResult) -> dict:
        """Record the generated reply, step the environment, extend the token list."""
        reply_text = self.reply_text(result)
        outcome, env_s = self.step_env(reply_text)
        return self.record(result, reply_text, outcome, env_s)

    def reply_text(self, result: TurnResult) -> str:
        return self.chat.decode(result.response_ids)

    def step_env(self, reply_text: str) -> tuple[StepResult, float]:
        """The environment's step and its seconds: the one part that may run on a thread of its
        own (executors/scheduling/env_steps.py); the tokenizer stays on the caller's."""
        t0 = time.perf_counter()
        outcome = self.env.step(reply_text)
        return outcome, time.perf_counter() - t0

    def record(self, result: TurnResult, reply_text: str, outcome: StepResult, env_s: float) -> dict:
        """The turn's row, and the token list extended for the next turn (or the rewards summed)."""
        prompt = list(self.tokens)
        self.turn += 1
        truncated = not outcome.done and self.turn >= self.max_turns
        self.done = outcome.done or truncated
        if self.rerouted:  # placement first: a re-run turn is what an operator looks for
            status = "rerouted"
        elif not outcome.info.get("valid_action", True):
            status = "invalid_action"
        else:
            status = "truncated" if truncated else "ok"
        row = {
            "run": self.run, "step": self.step, "policy_version": result.policy_version,
            "group": self.group, "trajectory": self.trajectory_id, "turn": self.turn - 1,
            "env": self.env.name, "prompt_ids": prompt, "response_ids": list(result.response_ids),
            "prompt_text": self.chat.decode(prompt, skip_special_tokens=False),
            "response_text": reply_text, "logprobs": list(result.logprobs),
            "reward": float(outcome.reward), "trajectory_reward": 0.0, "advantage": None,
            "done": self.done, "status": status, "worker": result.worker,
            "worker_kind": result.worker_kind,
            # waiting in the scheduler's queue before dispatch + in the engine's before scheduling
            "queued_s": self.scheduler_wait_s + result.queued_s,
            "prefill_s": result.prefill_s, "decode_s": result.decode_s, "env_s": env_s,
            "num_prompt_tokens": result.num_prompt_tokens,
            "num_cached_tokens": result.num_cached_tokens,
            "finished_at": datetime.now(timezone.utc),
        }
        self.rows.append(row)
        self.succeeded = bool(outcome.info.get("success", False))
        self.rerouted = False
        if not self.done:
            self.tokens = (prompt + list(result.response_ids)
                           + self.chat.close_reply(list(result.response_ids))
                           + self.chat.user_turn(outcome.observation))
        else:
            total = sum(r["reward"] for r in self.rows)
            for r in self.rows:
                r["trajectory_reward"] = total
        self.ready_since = time.monotonic()
        return row

