"""Guess the number: many short turns (a number out, "Higher"/"Lower" back).

A different turn profile from FrozenLake: tiny observations, tiny replies, and success
depends on using the whole history, which binary search does in at most
floor(log2(N)) + 1 guesses.
"""
from __future__ import annotations

import re

import numpy as np

from envs.base import MultiTurnEnv, StepResult

_NUMBER = re.compile(r"-?[0-9]+")


def parse_guess(reply: str, high: int) -> int | None:
    """The first integer in the reply if it lies in 1..high, else None."""
    m = _NUMBER.search(reply)
    if not m or len(m.group()) > 6:
        return None
    n = int(m.group())
    return n if 1 <= n <= high else None


class GuessEnv(MultiTurnEnv):
    name = "guess"

    def __init__(self, max_turns: int | None = None, high: int = 64) -> None:
        if high < 2:
            raise ValueError(f"high must be >= 2, got {high}")
        super().__init__(max_turns)
        self.high = high
        self.system_prompt = (
            f"I picked a number from 1 to {high}. Guess it. After each guess I say "
            "Higher or Lower. Reply with one number."
        )
        self.invalid_text = f"Invalid. Reply with one number from 1 to {high}."
        self.target = 1
        self.lo, self.hi = 1, high  # what the feedback so far allows

    def reset(self, seed: int) -> str:
        self.target = int(np.random.default_rng(seed).integers(1, self.high + 1))
        self.lo, self.hi = 1, self.high
        self._begin()
        return "Your guess?"

    def step(self, reply: str) -> StepResult:
        self._check_running()
        self.turn += 1
        guess = parse_guess(reply, self.high)
        info: dict = {"guess": guess}
        if guess is None:
            return self._invalid(self.invalid_text, info)
        self._invalid_in_a_row = 0
        info.update(valid_action=True, turn=self.turn)
        if guess == self.target:
            info["success"] = True
            return self._finish(f"Yes, it is {guess}!", 1.0, "found", info)
        info["success"] = False
        if guess < self.target:
            self.lo = max(self.lo, guess + 1)
            text = f"Higher than {guess}."
        else:
            self.hi = min(self.hi, guess - 1)
            text = f"Lower than {guess}."
        if self.turn >= self.max_turns:
            return self._finish(f"Out of turns. It was {self.target}.", 0.0, "max_turns", info)
        return StepResult(text, 0.0, False, info)

    def expert_reply(self) -> str:
        return str((self.lo + self.hi) // 2)
