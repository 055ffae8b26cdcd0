"""The co-serving executor inside a Dask worker: a WorkerPlugin plus the functions the
scheduler submits to serving workers, pinned by worker name
(executors/workers/rollout_worker.generate_turns dispatches here on workers that hold this plugin,
so the scheduler submits one function everywhere; weights load through executors/workers/weight_sync.py).
"""
from __future__ import annotations

from pathlib import Path

from distributed import WorkerPlugin, get_worker

from executors.turns import TurnRequest, TurnResult

PLUGIN = "rose-coserving"


class CoServingPlugin(WorkerPlugin):
    idempotent = True  # a second register must not rebuild two engines
    name = PLUGIN

    def __init__(self, serving_model_dir: str | Path, rollout_model_dir: str | Path, **config) -> None:
        self.serving_model_dir, self.rollout_model_dir = str(serving_model_dir), str(rollout_model_dir)
        self.config = dict(config)  # CoServingConfig fields (mode, slo, kv_blocks, ...)
        self.executor = None
        self.weights_digest = ""
        self.run: str | None = None

    def setup(self, worker) -> None:
        if "serving_gpu" not in worker.state.total_resources:
            return  # registered cluster-wide; only serving workers co-serve
        from executors.coserving.executor import CoServingConfig, CoServingExecutor

        cfg = CoServingConfig(Path(self.serving_model_dir), Path(self.rollout_model_dir), **self.config)
        self.executor = CoServingExecutor(cfg, worker=worker.name)

    def teardown(self, worker) -> None:
        if self.executor is not None:
            self.executor.close()
            self.executor = None

    def abort(self, request_ids: list[str]) -> None:
        """Out-of-band abort of rollout turns (executors/scheduling/scheduler.abort_turns)."""
        if self.executor is not None:
            self.executor.abort_rollout(list(request_ids))


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
    executor = _plugin().executor
    futures = [executor.submit_rollout(r) for r in requests]
    return [f.result() for f in futures]


def coserving_state() -> dict:
    """Runs on a serving worker: what the scheduler's admission view polls."""
    plugin = _plugin()
    m = plugin.executor.metrics()
    return {"worker": get_worker().name, "kind": "serving", "admitting": plugin.executor.admitting(),
            "run": plugin.run, "version": m["version"], "digest": plugin.weights_digest,
            "mode": m["mode"], "memory_state": m["kv"].get("state", "none"),
            "serving_in_flight": m["serving"]["in_flight"],
            "serving_queued": m["serving"]["queued_prefills"],
            "rollout_in_flight": m["rollout"]["in_flight"], "rollout_up": m["rollout"]["up"]}

