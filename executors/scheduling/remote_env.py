"""A trajectory's environment on an environment worker (executors/workers/env_host.py).

`RemoteEnv` is the environment an Episode sees when the stack has environment workers: every
step of one trajectory goes to the one instance it was reset on, through Dask, from the
scheduler's environment threads (it is `blocking`: executors/scheduling/env_steps.py). A step
that fails for the worker's sake (it died, restarted, or did not answer within the step
timeout) is retried with backoff on another environment worker, where the trajectory's
environment is rebuilt by replaying its replies from its seed (environments are deterministic
given the seed and the replies); an error the environment itself raises is the caller's, as it
would be in-process. `EnvHosts` picks the workers and counts the relaunches for the step summary.

A step in flight when its worker dies is not rerun by Dask: the restarted worker (same name, new
address) does not match the task's restriction, which stays `no-worker`. So a step still waiting
after a poll interval checks whether its worker is still the incarnation it was sent to (one
scheduler round trip a poll interval for all the trajectories, not one each) and is relaunched at
once if not, instead of after the whole step timeout.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from concurrent.futures import CancelledError

from distributed import Client
from distributed.comm.core import CommClosedError
from distributed.scheduler import KilledWorker

from envs.base import MultiTurnEnv, StepResult
from envs.latency import StepLatency
from envs.registry import make_env
from executors.workers.env_host import env_close, env_reset, env_step

log = logging.getLogger("rose.rollout")
# the worker's fault, not the environment's: relaunch elsewhere (LookupError: the instance is
# gone, i.e. the worker restarted under the same name)
WORKER_FAULTS = (KilledWorker, CommClosedError, TimeoutError, CancelledError, LookupError, OSError)


class EnvLost(RuntimeError):
    """A trajectory's environment failed on every environment worker it was tried on."""


class WorkerLeft(LookupError):
    """The worker a step was sent to died or restarted with the step in flight."""


class EnvHosts:
    def __init__(self, client: Client, workers: list[str], *, latency: StepLatency | None = None,
                 step_timeout_s: float = 60.0, attempts: int = 3, backoff_s: float = 0.5,
                 poll_s: float = 1.0) -> None:
        if not workers:
            raise ValueError("no environment workers to host environments on")
        if attempts < 1 or step_timeout_s <= 0 or backoff_s < 0 or poll_s <= 0:
            raise ValueError("need attempts >= 1, step_timeout_s > 0, backoff_s >= 0 and poll_s > 0")
        self.client, self.workers, self.latency = client, sorted(workers), latency
        self.step_timeout_s, self.attempts, self.backoff_s = step_timeout_s, attempts, backoff_s
        self.poll_s = poll_s
        self.probing = True  # False once the scheduler refused to say where the workers are
        self._addresses: dict[str, str] = {}  # worker name -> address, as last asked of the scheduler
        self._addresses_at = -float("inf")
        self._turn = itertools.count()
        self._lock = threading.Lock()  # environment threads pick and count at once
        self.relaunches = 0
        self.failed_on: dict[str, int] = {}  # worker -> steps that failed there
        self.live: dict[str, str] = {}  # env key -> worker holding it (episode not over)

    def env(self, name: str, max_turns: int | None = None) -> "RemoteEnv":
        return RemoteEnv(self, name, max_turns)

    def pick(self, avoid: str | None = None) -> str:
        """The next worker round-robin, one that has failed the fewest steps first, `avoid` last."""
        with self._lock:
            least = min(self.failed_on.get(w, 0) for w in self.workers)
            ok = [w for w in self.workers if self.failed_on.get(w, 0) == least and w != avoid]
            ok = ok or [w for w in self.workers if w != avoid] or self.workers
            return ok[next(self._turn) % len(ok)]

    def call(self, worker: str, fn, *args, **kwargs):
        sent_to = self._address_of(worker) if self.probing else None
        fut = self.client.submit(fn, *args, workers=[worker], allow_other_workers=False, pure=False,
                                 retries=0, **kwargs)
        deadline = time.monotonic() + self.step_timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                try:
                    return fut.result(timeout=max(0.0, min(self.poll_s, left)))
                except TimeoutError:
                    if left <= self.poll_s:
                        raise TimeoutError(f"no answer from {worker} within {self.step_timeout_s} s") from None
                    gone = self._gone(worker, sent_to)
                    if gone:
                        raise WorkerLeft(f"{worker} {gone} with the step in flight") from None
        except BaseException:
            fut.cancel()
            raise

    def _gone(self, worker: str, sent_to: str | None) -> str | None:
        """'left' or 'restarted' when `worker` is no longer the incarnation at `sent_to`; None while
        it is, or when the scheduler cannot say."""
        if self.probing:
            now = self._address_of(worker)
        if not self.probing:  # off, or the probe just failed
            return None
        if now is None:
            return "left"
        return "restarted" if sent_to is not None and now != sent_to else None

    def _address_of(self, worker: str) -> str | None:
        """The worker's address (None: not in the cluster) as the scheduler knew it at most a
        poll interval ago: asked once a poll interval for all the threads, not once each."""
        with self._lock:
            if time.monotonic() - self._addresses_at >= self.poll_s:
                names = set(self.workers)

                def addresses(dask_scheduler) -> dict[str, str]:  # nested: pickled by value
                    return {ws.name: addr for addr, ws in dask_scheduler.workers.items() if ws.name in names}

                try:
                    self._addresses = self.client.run_on_scheduler(addresses)
                except WORKER_FAULTS:
                    raise  # the cluster's connection: the step's fault, retried as any other
                except Exception as e:  # the probe itself (e.g. a scheduler whose worker records differ)
                    log.warning("cannot ask the scheduler where environment workers are (%s: %s); a step "
                                "in flight on a dead worker waits out the step timeout", type(e).__name__, e)
                    self.probing = False
                self._addresses_at = time.monotonic()
            return self._addresses.get(worker)

    def failed(self, worker: str) -> None:
        with self._lock:
            self.failed_on[worker] = self.failed_on.get(worker, 0) + 1

    def relaunched(self) -> None:
        with self._lock:
            self.relaunches += 1

    def close(self) -> int:
        """Drop the environments of trajectories not over (abandoned ones) from their workers."""
        by_worker: dict[str, list[str]] = {}
        for key, worker in self.live.items():
            by_worker.setdefault(worker, []).append(key)
        dropped = 0
        for worker, keys in by_worker.items():
            try:
                dropped += self.call(worker, env_close, keys)
            except WORKER_FAULTS:  # gone: its environments went with it
                pass
        self.live.clear()
        return dropped

    def summary(self) -> dict:
        return {"workers": self.workers, "relaunches": self.relaunches, "failed_on": dict(self.failed_on)}


class RemoteEnv(MultiTurnEnv):
    blocking = True  # every step is a round trip to an environment worker

    def __init__(self, hosts: EnvHosts, name: str, max_turns: int | None = None) -> None:
        template = make_env(name, max_turns=max_turns)  # name, prompt and limits; never stepped
        super().__init__(template.max_turns)
        self.name, self.system_prompt = template.name, template.system_prompt
        self.hosts, self.env_name = hosts, name
        self.key = uuid.uuid4().hex  # this instance's id on its worker
        self.seed: int | None = None
        self.replies: list[str] = []
        self.worker: str | None = None

    def reset(self, seed: int) -> str:
        if self.worker is not None:  # a second episode: a fresh instance (the old one is over)
            self.hosts.live.pop(self.key, None)
            self.key, self.worker = uuid.uuid4().hex, None
        self.seed, self.replies = seed, []
        self._begin()
        return self._on_a_worker(lambda: None)[1]

    def step(self, reply: str) -> StepResult:
        self._check_running()
        outcome, _ = self._on_a_worker(lambda: self.hosts.call(self.worker, env_step, self.key, reply))
        self.replies.append(reply)
        self.turn += 1
        if outcome.done:
            self.done = True
            self.hosts.live.pop(self.key, None)
        return outcome

    def _on_a_worker(self, call) -> tuple:
        """`call()` on the instance's worker, (re)building the instance first where it has none:
        at reset, and after a worker fault, elsewhere with the replies replayed."""
        h, last = self.hosts, None
        for attempt in range(h.attempts):
            try:
                observation = None
                if self.worker is None:
                    self.worker = h.pick(avoid=last)
                    observation = h.call(self.worker, env_reset, self.key, self.env_name, self.seed,
                                         h.latency, self.max_turns, tuple(self.replies))
                    h.live[self.key] = self.worker
                    if last is not None:
                        h.relaunched()
                return call(), observation
            except WORKER_FAULTS as e:
                log.warning("environment step on %s failed (%s: %s); relaunching on another worker",
                            self.worker, type(e).__name__, e)
                h.failed(self.worker)
                last, self.worker = self.worker, None
                time.sleep(h.backoff_s * 2 ** attempt)
        raise EnvLost(f"{self.env_name} environment {self.key} failed on {h.attempts} attempts "
                      f"(last worker {last})")

    def expert_reply(self) -> str:
        raise NotImplementedError("a remote environment gives no demonstrations (build them in-process)")
