"""One-step off-policy (RunConfig.max_staleness = 1): step s+1's rollout runs while step s trains.

Each step is still one `rl_step` flow run with its own task runs; the `train` flow runs two of
them at once, each in a thread, and `StepGates` orders their phases:

  flow s starts       once step s-1's rollout (and reward) is done, and version s-1-k is on the
                      rollout workers (step s-1-k's publish waited for them): one rollout at a
                      time, at most k steps ahead of training
  train s             after train s-1 (the trainer's version must be s-1)
  publish s           after publish s-1 (the sparse publisher's delta base is version s-1)

Training never waits for a publish: train keeps a snapshot of the weights it produced
(tasks/publish.py keep_snapshot), so train s+1 may start while publish s still pushes that
snapshot or waits for the rollout workers' pull.
With max_staleness = 0 none of this runs: the steps are called one after another.

If a step fails, every gate raises `PipelineStopped`: the other step in flight stops at its
next gate, after the phase it is running has finished (and persisted its result), so a resume
finds that phase `Cached` instead of losing or recomputing it.
"""
from __future__ import annotations

import contextvars
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

PHASES = ("rolled", "trained", "published")
_active: dict[str, "StepGates"] = {}  # run id -> gates of the pipelined train flow running it


class PipelineStopped(RuntimeError):
    """Another step of the run failed: this one stops at its next gate."""


def rollout_version(step: int, max_staleness: int) -> int:
    """The policy version step `step` rolls out with: s-1 synchronous, s-2 one step off-policy."""
    if step < 1 or max_staleness < 0:
        raise ValueError(f"step must be >= 1 and max_staleness >= 0, got {step}, {max_staleness}")
    return max(0, step - 1 - max_staleness)


class StepGates:
    """The last step that finished each phase; waits until a step has, or a step failed."""

    def __init__(self, done_through: int, trainer: str) -> None:
        self.trainer = trainer  # Dask worker name every phase is pinned to
        self.reached = dict.fromkeys(PHASES, done_through)
        self.failed: BaseException | None = None
        self._cv = threading.Condition()

    @property
    def placement(self) -> dict:
        """Dask annotations of a pipelined phase: on the trainer, by name, not by its one
        `train_gpu` resource (a rollout driver holding it would keep train from overlapping)."""
        return {"workers": [self.trainer], "allow_other_workers": False}

    def mark(self, phase: str, step: int) -> None:
        with self._cv:
            self.reached[phase] = max(self.reached[phase], step)
            self._cv.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cv:
            self.failed = self.failed or error
            self._cv.notify_all()

    def wait(self, phase: str, step: int) -> None:
        with self._cv:
            while self.reached[phase] < step and self.failed is None:
                self._cv.wait()
            if self.reached[phase] < step:
                raise PipelineStopped(f"a step failed ({self.failed!r}) before step {step} "
                                      f"was {phase}")


def active_gates(run_id: str) -> StepGates | None:
    """The gates of the pipelined run `run_id` in this process; None: steps run one by one."""
    return _active.get(run_id)


def run_pipelined(step_flow: Callable, cfg, first: int, trainer: str) -> list[dict]:
    """Run steps first..cfg.steps of `cfg` with one step of rollout ahead of training."""
    gates = StepGates(first - 1, trainer)
    futures: dict[int, Future] = {}
    _active[cfg.run_id] = gates

    def guarded(step: int) -> dict:
        try:
            return step_flow(cfg, step)
        except BaseException as e:
            gates.fail(e)
            raise

    try:
        # k+2 threads: a step still sending its serving report must not hold back a new one
        with ThreadPoolExecutor(cfg.max_staleness + 2, thread_name_prefix="rl-step") as pool:
            for step in range(first, cfg.steps + 1):
                try:
                    gates.wait("rolled", step - 1)
                    gates.wait("published", rollout_version(step, cfg.max_staleness))
                except PipelineStopped:
                    break  # the failed step's own error is raised below
                # in its own copy of the flow's context: a subflow of this train run. Started in
                # step order, so pin_step_identity's numbering of rl_step calls holds.
                futures[step] = pool.submit(contextvars.copy_context().run, guarded, step)
    finally:
        _active.pop(cfg.run_id, None)
    errors = [f.exception() for f in futures.values() if f.exception() is not None]
    if errors:
        raise next((e for e in errors if not isinstance(e, PipelineStopped)), errors[0])
    return [futures[s].result() for s in sorted(futures)]
