"""The contract every multi-turn text environment follows.

An episode is a conversation: `reset(seed)` gives the first observation, then each model
reply goes to `step`, which answers with the next observation and a reward. Everything is
deterministic given the seed, so the trajectories of a GRPO group (same seed) share their
initial state.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict = field(default_factory=dict)  # at least success: bool, valid_action: bool


class MultiTurnEnv(ABC):
    name: str = ""
    system_prompt: str = ""
    max_turns: int = 8
    invalid_penalty: float = -0.1
    max_invalid_in_a_row: int = 2
    # step() may block (a simulator, a tool, a container, a delay): the rollout scheduler runs
    # it on a thread of its own so other trajectories go on; instant steps run inline
    blocking: bool = False

    def __init__(self, max_turns: int | None = None) -> None:
        if max_turns is not None:
            if max_turns < 1:
                raise ValueError(f"max_turns must be >= 1, got {max_turns}")
            self.max_turns = max_turns
        self.turn = 0
        self.done = True
        self._invalid_in_a_row = 0
        self._started = False

    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start an episode from `seed`; return the first observation."""

    @abstractmethod
    def step(self, reply: str) -> StepResult:
        """Apply the model's raw reply for this turn."""

    @abstractmethod
    def expert_reply(self) -> str:
        """A good reply for the current state (demonstrations)."""

    # -- shared bookkeeping for subclasses ------------------------------------------------

    def _begin(self) -> None:
        self.turn = 0
        self.done = False
        self._invalid_in_a_row = 0
        self._started = True

    def _check_running(self) -> None:
        if not self._started:
            raise RuntimeError(f"{self.name}: call reset(seed) before step()")
        if self.done:
            raise RuntimeError(f"{self.name}: the episode is over; call reset(seed)")

    def _invalid(self, hint: str, info: dict) -> StepResult:
        """An unparsable reply: penalise, keep the state, end after too many in a row."""
        self._invalid_in_a_row += 1
        info.update(success=False, valid_action=False, turn=self.turn)
        if self._invalid_in_a_row >= self.max_invalid_in_a_row:
            return self._finish("Too many invalid replies.", self.invalid_penalty, "invalid", info)
        if self.turn >= self.max_turns:
            return self._finish("Out of turns.", self.invalid_penalty, "max_turns", info)
        return StepResult(hint, self.invalid_penalty, False, info)

    def _finish(self, text: str, reward: float, reason: str, info: dict) -> StepResult:
        self.done = True
        info.setdefault("success", False)
        info["reason"] = reason
        return StepResult(text, reward, True, info)
