"""Weight sync over Dask: the trainer publishes, every engine worker pulls in the background.

Trainer side: executors/workers/publishers.py (its publishers, kept across steps).

Worker side: a `PullAgent` per run and worker holds a storage.weights.receiver
.WeightReceiver (the worker's current bf16 weights), or for a run published sharded
(`sharded=True`) a storage.weights.sharded_receiver.ShardedReceiver of the engine's layout
(TP=1 here: it pulls every part), and pulls in a thread of its own; the
engine switches to the new version when the pull completes (between engine steps: the reload
runs on the engine's loop thread), so a serving worker keeps serving the old version meanwhile.
Pulls are single-flight: a request for a newer version while one is under way is picked up
when it ends.

Runs stay apart on a worker: each run keeps its own agent (its host copy of its weights), and
the engine holds one run's weights at a time (`EngineHolder`). A run's pull loads into the
engine only while the engine holds that run's weights (or no run's); else it stays in the host
copy, and the run's rollout `claim`s the engine (sync_weights): a load from host memory, no
pull, when its version is already there. Every turn names its run and an engine answers another
run's turn "stale" (executors/engine/vllm_engine.py, executors/coserving/plugin.py).

Building blocks for asynchronous publishing (called from tasks/flows, on the Dask client):
  start_pulls(client, workers, ...)  fire-and-forget: each worker starts pulling, returns at once
  wait_versions(client, workers, run, version, timeout)  block until they hold >= version
  policy_floor(step, max_staleness, worker_kind)  the oldest policy a turn may use
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from distributed import Client, get_worker

from executors.workers.pinned import gather_live, submit_pinned
from storage.relay.pool import shared_relay
from storage.shards.layout import ParallelLayout
from storage.weights.receiver import WeightReceiver
from storage.weights.sharded_receiver import ShardedReceiver

Loader = Callable[[int, dict[str, torch.Tensor]], dict[str, Any]]
Receiver = WeightReceiver | ShardedReceiver
_agents: dict[tuple[str, str], "PullAgent"] = {}  # (worker id, run) -> agent
_holders: dict[str, "EngineHolder"] = {}  # worker id -> which run's weights its engine holds
_lock = threading.Lock()
FULL_TIMEOUT_S = 120.0  # how long a worker waits for a requested full snapshot


# ---- worker side -----------------------------------------------------------------------------
def policy_floor(step: int, max_staleness: int, worker_kind: str) -> int:
    """The oldest policy version a turn of `step` may run on, on a worker of `worker_kind`.

    Step s rolls out with version s-1. Dedicated rollout workers must hold it (they pull right
    after the publish, before they are needed); borrowed serving workers may lag by
    `max_staleness` versions while their pull completes in the background."""
    if step < 1 or max_staleness < 0:
        raise ValueError(f"step must be >= 1 and max_staleness >= 0, got {step}, {max_staleness}")
    lag = max_staleness if worker_kind == "serving" else 0
    return max(0, step - 1 - lag)


class EngineHolder:
    """The run whose weights one worker's engine holds; loads into it are serialized here."""

    def __init__(self) -> None:
        self.run: str | None = None
        self.switches = 0  # loads of another run's weights than the engine held
        self.lock = threading.Lock()  # held across a decision and its load


class PullAgent:
    """Background puller of one run on one worker; see the module docstring."""

    def __init__(self, receiver: Receiver, loader: Loader, worker: str = "",
                 holder: EngineHolder | None = None) -> None:
        self.receiver, self.loader, self.worker = receiver, loader, worker
        self.holder = holder or EngineHolder()
        self.target: int | None = None
        self.await_s = 0.0  # how long the next pull waits for its version to be published
        self.loaded: int | None = None  # version this run last loaded into the engine
        self.held: int | None = None  # version its host copy holds, loaded or not
        self._claim = False  # the next pull loads into the engine even if another run's is there
        self.last: dict[str, Any] = {}  # the last completed pull (or its error)
        self.error: str = ""
        self._dirty = False  # a request not looked at yet
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None

    def request(self, version: int, await_s: float = 0.0, claim: bool = False) -> None:
        """Pull `version` (or newer) in the background. Even when the engine already runs it,
        the receiver looks at the relay's manifest once (a republished version with other bits
        is pulled again). `await_s`: the version's publish may not have begun; wait that long
        for it, and stream it as it lands (storage/weights/stream_pull.py). `claim`: load it
        into the engine even if it holds another run's weights (this run's rollout needs it)."""
        with self._cv:
            self.target = version if self.target is None else max(self.target, version)
            self.await_s = await_s
            self._claim = self._claim or claim
            self.error, self._dirty = "", True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"rose-pull-{self.receiver.run}")
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._dirty:
                    self._thread = None
                    self._cv.notify_all()
                    return
                self._dirty, target, claim, self._claim = False, self.target, self._claim, False
            try:
                record = self._pull_and_load(target, claim)
            except Exception as e:  # reported through status/wait; the next request retries
                with self._cv:
                    failed = f"pull of v{target} failed: {type(e).__name__}: {e}"
                    self.last = {"worker": self.worker, "version": target, "error": failed}
                    self._cv.notify_all()
                    if self._dirty:  # a request came in during the failed pull: it retries now
                        continue
                    self.error, self._thread = failed, None
                return
            with self._cv:
                self.held, self.last = record["version"], record
                if not record.get("deferred"):
                    self.loaded = record["version"]
                self._cv.notify_all()

    @property
    def run(self) -> str:
        return self.receiver.run

    def _pull_and_load(self, target: int, claim: bool = False) -> dict[str, Any]:
        t0 = time.perf_counter()
        ahead = {"await_s": self.await_s} if isinstance(self.receiver, WeightReceiver) else {}
        report = self.receiver.pull(target, accept_newer=True, **ahead)
        t1 = time.perf_counter()
        record = {"worker": self.worker, **report.as_dict(), "pulled": report.mode != "noop",
                  "digest": self.receiver.digest}
        with self.holder.lock:
            ours = self.holder.run == self.run
            if not ours and not claim and self.holder.run is not None:
                # another run's weights are in the engine: this version waits in the host copy
                return {**record, "deferred": True, "engine_run": self.holder.run,
                        "pull_s": t1 - t0, "load_s": 0.0, "total_s": t1 - t0}
            if ours and report.mode == "noop" and self.loaded == report.version:
                return {**self.last, **record, "deferred": False, "pull_s": t1 - t0,
                        "load_s": 0.0, "total_s": t1 - t0}
            t_load = time.perf_counter()
            loaded = self.loader(report.version, self.receiver.tensors)
            switched = not ours and self.holder.run is not None
            self.holder.run, self.holder.switches = self.run, self.holder.switches + switched
        return {**record, **loaded, "deferred": False, "switched": switched,
                "pull_s": t1 - t0, "load_s": time.perf_counter() - t_load,
                "total_s": time.perf_counter() - t0}

    def wait(self, version: int, timeout: float) -> dict[str, Any]:
        """Block until the requests so far are done and the run holds >= version: in the
        engine, or in its host copy while another run's weights are in the engine ("deferred" in
        the record); the last pull's record. TimeoutError, or RuntimeError when the pull failed."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._thread is not None or self.held is None or self.held < version:
                if self.error:
                    raise RuntimeError(f"worker {self.worker}: {self.error}")
                if self._thread is None:
                    raise RuntimeError(f"worker {self.worker}: no pull of v{version} requested "
                                       f"(the engine runs v{self.loaded})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"worker {self.worker}: v{version} not loaded within "
                                       f"{timeout:g} s (the engine runs v{self.loaded})")
                self._cv.wait(min(left, 1.0))
            return dict(self.last)

    def status(self) -> dict[str, Any]:
        with self._cv:
            return {"worker": self.worker, "run": self.run, "loaded": self.loaded,
                    "held": self.held, "engine_run": self.holder.run,
                    "target": self.target, "pulling": self._thread is not None,
                    "error": self.error, "last": dict(self.last)}


def agent(relay_kind: str, run: str, batch_bytes: int = 1 << 30,
          loader: Loader | None = None, sharded: bool = False) -> PullAgent:
    """This worker's agent for `run` (created with the engine loader of this worker). Keyed by
    the worker's id too: several Dask workers may share a process (tests, threaded clusters),
    and a worker started again in a process is a new one."""
    worker = get_worker()
    name, wid = worker.name, worker.id
    with _lock:
        found = _agents.get((wid, run))
        if found is None or isinstance(found.receiver, ShardedReceiver) != sharded:
            relay = shared_relay(relay_kind, role="reader")
            receiver = (ShardedReceiver(relay, run, ParallelLayout(1), requester=name,  # engines: TP=1
                                        batch_bytes=batch_bytes, full_timeout_s=FULL_TIMEOUT_S)
                        if sharded else WeightReceiver(relay, run, requester=name, batch_bytes=batch_bytes,
                                                       full_timeout_s=FULL_TIMEOUT_S))
            loader = loader or engine_loader(run, lambda: receiver.digest)
            # the other runs' agents stay: their host copies are what a switch back loads from
            holder = _holders.setdefault(wid, EngineHolder())
            found = _agents[wid, run] = PullAgent(receiver, loader, name, holder)
        found.receiver.batch_bytes = batch_bytes
        return found


def drop_agents(worker_id: str) -> int:
    """Forget this worker's agents and the weights their receivers hold (its engine was parked:
    the next borrower's sync pulls in full and so loads, waking the engine). Returns how many."""
    with _lock:
        gone = [k for k in _agents if k[0] == worker_id]
        for key in gone:
            del _agents[key]
        _holders.pop(worker_id, None)  # the engine holds no run's weights any more
    return len(gone)


def engine_loader(run: str, digest: Callable[[], str]) -> Loader:
    """Loads weights into this worker's engine: the dedicated rollout engine, or the rollout
    model of a co-serving executor. RuntimeError if the worker has neither."""
    from executors.coserving.plugin import coserving_plugin
    from executors.workers.rollout_worker import PLUGIN
    from executors.engine.vllm_engine import read_weight

    worker = get_worker()
    coserving = coserving_plugin(worker)
    if coserving is not None:
        coserving.forget_weights = lambda: drop_agents(worker.id)

        def load_coserving(version: int, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
            coserving.executor.load_rollout_weights(version, tensors)
            coserving.run, coserving.weights_digest = run, digest()
            return {"digest": coserving.weights_digest,
                    "engine_matches": coserving.executor.rollout_weight_matches(tensors)}
        return load_coserving
    plugin = worker.plugins.get(PLUGIN)
    if plugin is None or getattr(plugin, "loop", None) is None:
        raise RuntimeError(f"worker {worker.name} has no rollout engine to load weights into")

    def load_rollout(version: int, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        plugin.loop.reload(tensors, version, run)  # loop thread: in-flight turns rerun on `version`
        plugin.run, plugin.weights_digest = run, digest()
        embed = "model.embed_tokens.weight"
        matches = None
        if embed in tensors:
            got = plugin.loop.call(lambda e: read_weight(e, embed))
            matches = bool(torch.equal(got.view(torch.int16), tensors[embed].view(torch.int16)))
        return {"digest": plugin.weights_digest, "engine_matches": matches}
    return load_rollout


# ---- functions submitted to a worker ---------------------------------------------------------
def sync_weights(relay_kind: str, run: str, version: int, batch_bytes: int = 1 << 30,
                 timeout: float = 600.0, sharded: bool = False) -> dict[str, Any]:
    """Pull `version` (or newer) and load it, claiming the engine for `run` (its rollout is
    next); returns once the engine runs it."""
    a = agent(relay_kind, run, batch_bytes, sharded=sharded)
    a.request(version, claim=True)
    return a.wait(version, timeout)


def start_pull(relay_kind: str, run: str, version: int, batch_bytes: int = 1 << 30,
               sharded: bool = False, await_s: float = 0.0) -> dict:
    """Fire-and-forget on a worker: start pulling `version`, return at once (`await_s`: its
    publish may not have begun). A worker with no engine answers {"skipped": reason}."""
    try:
        a = agent(relay_kind, run, batch_bytes, sharded=sharded)
    except RuntimeError as e:
        return {"worker": get_worker().name, "skipped": str(e)}
    a.request(version, await_s)
    return a.status()


def wait_pull(run: str, version: int, timeout: float) -> dict[str, Any]:
    a = _agents.get((get_worker().id, run))
    if a is None:
        raise RuntimeError(f"worker {get_worker().name}: no pull of run {run!r} was started")
    return a.wait(version, timeout)


def pull_status(run: str) -> dict[str, Any]:
    a = _agents.get((get_worker().id, run))
    return a.status() if a is not None else {"worker": get_worker().name, "run": run,
                                             "loaded": None, "pulling": False}


# ---- client side ----------------------------------------------------------------------------
START_TIMEOUT_S = 60.0  # start_pull returns at once on a live worker


def start_pulls(client: Client, workers: list[str], relay_kind: str, run: str, version: int,
                batch_bytes: int = 1 << 30,
                left_out: dict[str, str] | None = None, sharded: bool = False,
                await_s: float = 0.0) -> dict[str, dict]:
    """Start pulls everywhere at once; worker -> its agent status (or "skipped"). Workers not
    running, gone, or silent for START_TIMEOUT_S are not waited for (pinned.py): they go into
    `left_out` with the reason. `sharded`: the run is published sharded; `await_s`: started
    before the push, the pulls wait that long for it to begin (and stream it)."""
    pinned, left = submit_pinned(client, start_pull, workers, relay_kind, run, version,
                                 batch_bytes, sharded, await_s)
    started, late = gather_live(client, pinned, START_TIMEOUT_S)
    if left_out is not None:
        left_out.update(left, **late)
    return started


def wait_versions(client: Client, workers: list[str], run: str, version: int,
                  timeout: float = 600.0,
                  left_out: dict[str, str] | None = None) -> dict[str, dict]:
    """Block until every worker's engine runs >= version; worker -> its last pull record.
    Raises a worker's error (TimeoutError, or the pull's failure). A worker that leaves the
    cluster or restarts meanwhile is not waited for: it goes into `left_out` (the caller
    passes one to go on without it) or, without `left_out`, raises RuntimeError."""
    pinned, left = submit_pinned(client, wait_pull, workers, run, version, timeout)
    # the worker's own wait times out first and says why; this bound is for a silent worker
    pulled, late = gather_live(client, pinned, timeout + 30.0)
    left.update(late)
    if left and left_out is None:
        raise RuntimeError(f"workers left while waiting for v{version}: {left}")
    if left_out is not None:
        left_out.update(left)
    return pulled
