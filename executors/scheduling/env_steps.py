"""Environment steps off the rollout scheduler's thread: trajectory-level stepping.

An environment whose step blocks (`MultiTurnEnv.blocking`: a simulator, a tool, a container, a
configured delay) steps on a thread of its own as soon as its trajectory's turn comes back,
while the scheduler goes on routing every other trajectory's turns: no trajectory waits for
another's environment (no turn-wide barrier), and a slow step delays only its own trajectory.
Instant environments step inline: a thread hop would cost more than the step. Only the
environment's step runs here; decoding the reply and encoding the next prompt stay on the
scheduler's thread (one tokenizer, one thread).
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from envs.base import StepResult
from executors.scheduling.episode import Episode
from executors.turns import TurnResult

POLL_S = 0.005  # the scheduler's wait for turns while environment steps are pending


class EnvSteps:
    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"environment threads must be >= 1, got {threads}")
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None  # started by the first blocking step
        self._pending: dict[Future, tuple[str, TurnResult, str]] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, trajectory_id: str, episode: Episode, result: TurnResult) -> None:
        """Step `episode`'s environment with this turn's reply, on a thread of the pool."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="rose-env")
        reply = episode.reply_text(result)
        self._pending[self._pool.submit(episode.step_env, reply)] = (trajectory_id, result, reply)

    def finished(self, timeout_s: float = 0.0) -> list[tuple[str, TurnResult, str, StepResult, float]]:
        """(trajectory, turn result, reply, outcome, env seconds) of the steps done, waiting up to
        `timeout_s` for the first; in trajectory order. A step that raised raises here."""
        if not self._pending:
            return []
        done, _ = wait(list(self._pending), timeout=timeout_s, return_when=FIRST_COMPLETED)
        out = []
        for fut in done:
            tid, result, reply = self._pending.pop(fut)
            outcome, env_s = fut.result()
            out.append((tid, result, reply, outcome, env_s))
        return sorted(out, key=lambda step: step[0])

    def close(self) -> None:
        """Stop the threads; pending steps (abandoned trajectories only) are not waited for."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        self._pending.clear()
