"""The dedicated rollout worker: one vLLM engine (prefix caching on) inside a Dask worker.

The plugin lives as long as the worker; weights change in place each RL step (pulled from
the relay), so the engine is never restarted. The module-level functions are what the
scheduler submits, pinned by worker name.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import xxhash
from distributed import WorkerPlugin, get_worker

from executors.turns import TurnRequest, TurnResult
from executors.engine.preload import wait_for_engine_import
from executors.engine.vllm_engine import EngineLoop, EngineSpec

PLUGIN = "rose-rollout"


class RolloutWorkerPlugin(WorkerPlugin):
    idempotent = True  # a second register must not rebuild the engine

    def __init__(self, model_dir: str | Path, kind: str = "rollout", max_model_len: int = 2048):
        self.name = PLUGIN
        self.model_dir, self.kind, self.max_model_len = str(model_dir), kind, max_model_len
        self.loop: EngineLoop | None = None
        self.weights_digest = ""
        self.run: str | None = None

    def setup(self, worker) -> None:
        if "rollout_gpu" not in worker.state.total_resources:
            return  # registered cluster-wide; only rollout workers hold an engine
        wait_for_engine_import()  # the worker's preload may still be importing vLLM
        spec = EngineSpec(Path(self.model_dir), max_model_len=self.max_model_len)
        self.loop = EngineLoop(spec, worker=worker.name, worker_kind=self.kind)

    def teardown(self, worker) -> None:
        if self.loop is not None:
            self.loop.close()
            self.loop = None


def _plugin() -> RolloutWorkerPlugin:
    plugin = get_worker().plugins.get(PLUGIN)
    if plugin is None or plugin.loop is None:
        raise RuntimeError(f"worker {get_worker().name} has no rollout engine")
    return plugin


def generate_turns(requests: list[TurnRequest]) -> list[TurnResult]:
    """Runs on a rollout worker: all turns join the engine's continuous batch. On a serving
    worker that holds the co-serving executor, the turns go to it instead (one function for
    the scheduler to submit everywhere)."""
    from executors.coserving.plugin import coserving_plugin, generate_turns_coserving

    if coserving_plugin() is not None:
        return generate_turns_coserving(requests)
    return _plugin().loop.generate(requests)


def worker_state() -> dict:
    plugin = _plugin()
    return {"worker": get_worker().name, "kind": plugin.kind, "run": plugin.run,
            "version": plugin.loop.policy_version, "inflight": plugin.loop.num_inflight(),
            "digest": plugin.weights_digest, "idle_s": time.monotonic() - plugin.loop.last_progress}


def weight_digests(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """Per tensor, a digest of its values as fp32 bits (exact for bf16): two holders compare
    by value even if one keeps a weight in another dtype, and a mismatch names the tensor."""
    return {name: xxhash.xxh3_64(t.detach().float().contiguous().view(torch.uint8).numpy()
                                 .tobytes()).hexdigest() + f":{tuple(t.shape)}"
            for name, t in tensors.items()}


def engine_weight_digests() -> dict[str, str]:
    """Runs on a rollout or serving worker: weight_digests of what its rollout engine computes
    with, read from the engine itself (HF names; `lm_head.weight` even when tied), not from what
    the receiver pulled: the check that the policy sampled is the policy trained."""
    from executors.coserving.plugin import coserving_plugin
    from executors.engine.weights_view import engine_weights

    coserving = coserving_plugin()
    if coserving is not None:
        weights = coserving.executor.rollout_engine_weights()
        if weights is None:
            raise RuntimeError(f"worker {get_worker().name} has no rollout engine attached")
    else:
        weights = _plugin().loop.call(engine_weights)
    return weight_digests(weights)
