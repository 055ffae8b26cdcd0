"""The co-serving executor inside a Dask worker: a WorkerPlugin plus the functions the
scheduler submits to serving workers, pinned by worker name.

A serving worker is a co-serving worker from the start: the plugin is registered when the
stack comes up (`rose up`, executors/coserving/registration.py), builds the serving and rollout engines and
opens the worker's OpenAI-compatible endpoint, which serves whether or not a run trains. With
`start_parked` (stack.coserving.park_at_start) the rollout engine is parked until a run borrows
the worker (parking.py: no run holds it yet).
A training run borrows the rollout side (weights pulled by executors/workers/weight_sync.py,
turns routed by executors/scheduling/) and detaches it when it ends; serving never stops.
executors/workers/rollout_worker.generate_turns dispatches here on workers holding this
plugin, so the scheduler submits one function everywhere.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from distributed import WorkerPlugin, get_worker

from executors.coserving.rollout_turn import ABORTED, empty_result  # ABORTED: by reason
from executors.turns import TurnRequest, TurnResult

PLUGIN = "rose-coserving"
PORT_ENV = "ROSE_ENDPOINT_PORT"  # set per serving worker by the stack: a URL stable over restarts


class CoServingPlugin(WorkerPlugin):
    idempotent = True  # a second register must not rebuild two engines
    name = PLUGIN

    def __init__(self, serving_model_dir: str | Path, rollout_model_dir: str | Path,
                 endpoint: bool = True, api_keys: tuple[str, ...] = (),
                 open_paths: tuple[str, ...] | None = None, start_parked: bool = False, **config) -> None:
        self.serving_model_dir, self.rollout_model_dir = str(serving_model_dir), str(rollout_model_dir)
        self.endpoint = endpoint
        # the stack's serving workers: no run holds one when it starts (or restarts), so its
        # rollout engine parks at once where `park_when_idle` is on; the first borrower's weight
        # sync wakes it. Off for callers that drive the rollout engine without a weight sync.
        self.start_parked = start_parked
        # the endpoint's API keys (executors/coserving/endpoint/api_keys.py); never logged
        self.api_keys, self.open_paths = tuple(api_keys), open_paths
        self.config = dict(config)  # CoServingConfig fields (mode, slo, kv_blocks, ...)
        self.executor = None
        self.endpoint_url: str | None = None
        self.weights_digest = ""
        self.run: str | None = None  # the training run borrowing the rollout side, if any
        # set by the worker's weight sync (executors/workers/weight_sync.py): drop what its
        # agents hold, so the next borrower's sync loads in full (and so wakes a parked engine)
        self.forget_weights: Callable[[], object] | None = None
        self.step_started_at = time.monotonic()
        self.admitted_at_step = self.aborted_at_step = 0

    def setup(self, worker) -> None:
        if "serving_gpu" not in worker.state.total_resources:
            return  # registered cluster-wide; only serving workers co-serve
        from executors.engine.preload import wait_for_engine_import

        wait_for_engine_import()  # the worker's preload may still be importing vLLM
        from executors.coserving.executor import CoServingConfig, CoServingExecutor

        cfg = CoServingConfig(Path(self.serving_model_dir), Path(self.rollout_model_dir), **self.config)
        self.executor = CoServingExecutor(cfg, worker=worker.name)
        if self.start_parked:
            self.park()  # before the endpoint opens: serving has the whole KV pool from its first user
        if self.endpoint:
            from executors.coserving.endpoint.app import start_endpoint

            try:
                paths = {} if self.open_paths is None else {"open_paths": tuple(self.open_paths)}
                ep = start_endpoint(self.executor, cfg.serving_model_dir, worker=worker.name,
                                    port=int(os.environ.get(PORT_ENV, "0")), api_keys=self.api_keys,
                                    **paths)
            except BaseException:
                self.executor.close()
                self.executor = None
                raise
            self.endpoint_url = ep.url

    def teardown(self, worker) -> None:
        if self.executor is None:
            return
        self.detach(park=False)  # the executor closes next
        if self.endpoint_url is not None:
            from executors.coserving.endpoint.app import stop_endpoint

            stop_endpoint(worker.name)  # drains in-flight requests before it returns
            self.endpoint_url = None
        self.executor.close()
        self.executor = None

    def abort(self, request_ids: list[str]) -> None:
        """Out-of-band abort of rollout turns (executors/scheduling/scheduler.abort_turns)."""
        if self.executor is not None:
            self.executor.abort_rollout(list(request_ids))

    def detach(self, park: bool = True) -> int:
        """The borrowing run is over (ended, failed, or the stack goes down): abort its rollout
        turns still here (the scheduler reroutes them if it still runs), and park the rollout
        engine where `park_when_idle` says so (parking.py); serving is untouched."""
        live = self.executor.rollout_in_flight() if self.executor is not None else []
        if live:
            self.executor.abort_rollout(live)
        self.run = None
        if park:
            self.park()
        return len(live)

    def park(self) -> bool:
        """No run holds this worker: give its rollout engine's memory back to serving, and drop
        the weights its weight agent holds (the next borrower's sync pulls afresh and so wakes
        the engine). False where `park_when_idle` is off or there is no rollout engine."""
        if self.executor is None or not self.executor.cfg.park_when_idle:
            return False
        parked = self.executor.park()["parked"]
        if parked and self.forget_weights is not None:
            self.forget_weights()
        if parked:
            self.run, self.weights_digest = None, ""
        return parked

    def start_step(self) -> None:
        """A new RL step: rollout KV budget from recent serving usage, freeze lifted, and the
        window of the step's serving report opens."""
        self.executor.start_step()
        m = self.executor.metrics(fresh=True)["rollout"]
        self.step_started_at = time.monotonic()
        self.admitted_at_step, self.aborted_at_step = m["admitted"], _aborted(m)
        self.rollout_at_step = m

    def step_report(self) -> dict:
        """Serving over the step so far (requests, P99s, SLO attainment), and the rollout turns
        the executor admitted and aborted in it, and its KV timeline (kv_timeline.py)."""
        from executors.coserving.serving_window import window_report

        ex = self.executor
        m = ex.metrics(fresh=True)
        requests = ex.served_since(self.step_started_at)
        return {"worker": get_worker().name, "endpoint": self.endpoint_url,
                **window_report(requests, m["slo"]["ttft_s"], m["slo"]["tpot_s"]),
                "rollout_admitted": m["rollout"]["admitted"] - self.admitted_at_step,
                "rollout_aborted": _aborted(m["rollout"]) - self.aborted_at_step,
                **_step_counts(getattr(self, "rollout_at_step", {}), m["rollout"]),
                **park_columns(m["park"]),
                "kv_timeline": ex.kv_timeline()}


DENIAL_REASONS = {"tpot_slack": "tpot", "ttft_slack": "ttft", "kv_headroom": "kv", "yielded": "yielded"}


def _step_counts(before: dict, now: dict) -> dict:
    """Admission's answers over the step: rollout steps denied by reason (rollout_denied_tpot,
    _ttft, _kv, _yielded), turns handed back before they started, users rollout yielded to."""
    b, n = before.get("denied") or {}, now.get("denied") or {}
    return {**{f"rollout_denied_{short}": n.get(k, 0) - b.get(k, 0) for k, short in DENIAL_REASONS.items()},
            **{f"rollout_{k}": now.get(k, 0) - before.get(k, 0)
               for k in ("returned_unstarted", "yielded_to_users")}}


def park_columns(park: dict) -> dict:
    """Park and wake, per worker (parking.py): parked now, the last wake's seconds, the serving
    KV pages and bytes (KV pool plus weights) the last park gave back."""
    return {"parked": park["parked"], "wake_s": park["wake_s"], "pages_given_back": park["pages_given_back"],
            "bytes_given_back": park["kv_bytes_given_back"] + park["weight_bytes_given_back"]}


def _aborted(rollout_metrics: dict) -> int:
    return sum(rollout_metrics.get(k, 0) for k in ABORTED.values())


def coserving_plugin(worker=None) -> CoServingPlugin | None:
    """This worker's co-serving plugin when it holds an executor, else None."""
    try:
        worker = worker or get_worker()
    except ValueError:  # not inside a Dask worker
        return None
    plugin = worker.plugins.get(PLUGIN)
    return plugin if plugin is not None and plugin.executor is not None else None


def _plugin() -> CoServingPlugin:
    plugin = coserving_plugin()
    if plugin is None:
        raise RuntimeError(f"worker {get_worker().name} has no co-serving executor")
    return plugin


def generate_turns_coserving(requests: list[TurnRequest]) -> list[TurnResult]:
    """Runs on a serving worker; same contract as rollout_worker.generate_turns. A turn cut by
    a serving burst or stalled comes back with finished_reason "abort": reroute it."""
    from distributed import rejoin, secede

    plugin = _plugin()
    executor = plugin.executor
    # a turn of a run other than the one whose weights the rollout engine holds: "stale" (the
    # scheduler resyncs the worker to its run, or routes elsewhere), never computed on them
    futures = [executor.submit_rollout(r) if r.runs_on(plugin.run or "")
               else _answered(empty_result(r, get_worker().name, executor.version, "stale"))
               for r in requests]
    # The scheduler sends one future per turn here: waiting on them must not hold the worker's
    # few Dask threads (2 on the demo stack), or the next turns and the admission polls would
    # queue behind turns the executor is holding back for serving.
    secede()
    try:
        return [f.result() for f in futures]
    finally:
        rejoin()


def _answered(result: TurnResult) -> Future:
    fut: Future = Future()
    fut.set_result(result)
    return fut


def coserving_state() -> dict:
    """Runs on a serving worker: what the scheduler's admission view polls."""
    plugin = _plugin()
    m = plugin.executor.metrics()
    return {"worker": get_worker().name, "kind": "serving", "admitting": plugin.executor.admitting(),
            "run": plugin.run, "version": m["version"], "digest": plugin.weights_digest,
            "mode": m["mode"], "memory_state": m["kv"].get("state", "none"),
            "serving_in_flight": m["serving"]["in_flight"],
            "serving_queued": m["serving"]["queued_prefills"],
            "rollout_in_flight": m["rollout"]["in_flight"], "rollout_up": m["rollout"]["up"],
            "endpoint": plugin.endpoint_url, **park_columns(m["park"])}


def coserving_load() -> dict:
    """Runs on a serving worker: its serving load for the borrowing policy
    (executors/policies/borrow.py): KV use by serving now, and TTFT P99 over the recent
    requests (the executor's usage window) against the SLO; and whether its rollout engine is
    parked (a borrower's weight sync wakes it)."""
    import numpy as np

    ex = _plugin().executor
    m = ex.metrics(fresh=True)
    recent = [r.ttft_s for r in ex.served_since(time.monotonic() - ex.cfg.usage_window_s) if r.ok]
    return {"worker": get_worker().name, "kv_used": m["serving"]["used_blocks"] / max(1, ex.total),
            "ttft_p99_s": float(np.percentile(recent, 99)) if recent else None,
            "slo_ttft_s": m["slo"]["ttft_s"], "parked": m["park"]["parked"]}


def serving_endpoint(dask_worker=None) -> str | None:
    """Runs on any worker (Client.run passes `dask_worker`: there is no task context there):
    this worker's serving endpoint URL, None where it has none."""
    plugin = coserving_plugin(dask_worker)
    return plugin.endpoint_url if plugin is not None else None


def start_coserving_step(idle_for: str | None = None) -> bool:
    """Runs on a serving worker: open a new RL step. False where there is no executor.
    `idle_for`: run `idle_for` found this worker free and did not borrow it this step: park it,
    unless another run has loaded its weights since (it borrowed the worker meanwhile)."""
    plugin = coserving_plugin()
    if plugin is None:
        return False
    if idle_for is not None and plugin.run in (None, idle_for):
        plugin.park()
    plugin.start_step()
    return True


def serving_slo(dask_worker=None) -> dict | None:
    """Runs on a serving worker (Client.run): the SLO its admission holds to now, and whence."""
    plugin = coserving_plugin(dask_worker)
    return plugin.executor.metrics(fresh=True)["slo"] if plugin is not None else None


def set_serving_slo(ttft_s: float, tpot_s: float, source: str, dask_worker=None) -> dict | None:
    """Runs on a serving worker (Client.run): hold admission and the endpoint to this SLO.
    Returns the SLO now in force, None where the worker has no executor."""
    from executors.policies.slo_admission import SLOConfig

    plugin = coserving_plugin(dask_worker)
    if plugin is None:
        return None
    plugin.executor.set_slo(SLOConfig(ttft_s=ttft_s, tpot_s=tpot_s), source)
    return plugin.executor.metrics(fresh=True)["slo"]


def coserving_step_report() -> dict | None:
    """Runs on a serving worker: its step report (CoServingPlugin.step_report), else None."""
    plugin = coserving_plugin()
    return plugin.step_report() if plugin is not None else None


def serving_park_state(dask_worker=None) -> dict | None:
    """Runs on any worker (Client.run): its rollout engine's park state (park_columns), None
    where it has no co-serving executor (`rose status`)."""
    plugin = coserving_plugin(dask_worker)
    return park_columns(plugin.executor.park_state()) if plugin is not None else None


def detach_coserving(dask_worker=None) -> int:
    """Runs on a serving worker (by Client.run): detach the rollout side from the run."""
    plugin = coserving_plugin(dask_worker)
    return plugin.detach() if plugin is not None else 0
