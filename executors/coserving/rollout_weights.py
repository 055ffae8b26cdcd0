"""The co-serving executor's rollout weights: reload a published version into the rollout
engine between turns (waking a parked engine first, parking.py), read back what the engine
computes with, drop its prefix cache.

A mixin of CoServingExecutor (executor.py): every engine call runs on the executor's loop thread
through `self._call`, since that thread alone owns the engines.
"""
from __future__ import annotations

import time

import torch


class RolloutWeights:
    def load_rollout_weights(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        self._call(lambda: self._load_weights(version, tensors))

    def reset_rollout_prefix_cache(self) -> bool:
        """Drop every leased rollout prefix and vLLM's rollout prefix cache (benches: a cold
        start per case). False when turns still hold blocks (vLLM then keeps its cache)."""
        def reset() -> bool:
            if self.rollout is None:
                return False
            self.rollout.drop_all_leases()
            return bool(self.rollout.engine.reset_prefix_cache())
        return self._call(reset)

    def rollout_engine_weights(self) -> dict[str, torch.Tensor] | None:
        """The rollout engine's weights as it computes with them (read-only); None if detached."""
        from executors.engine.weights_view import engine_weights

        return self._call(lambda: None if self.rollout is None else engine_weights(self.rollout.engine))

    def rollout_weight_matches(self, tensors: dict[str, torch.Tensor]) -> bool | None:
        """Does the rollout engine hold these embeddings bit for bit (None: cannot tell)."""
        from executors.engine.vllm_engine import read_weight

        name = "model.embed_tokens.weight"
        if name not in tensors or self.rollout is None:
            return None

        def same() -> bool | None:
            if self.rollout is None:
                return None
            want = tensors[name]
            got = read_weight(self.rollout.engine, name)[: want.shape[0]]  # vLLM pads the vocab
            return bool(torch.equal(got.view(torch.int16), want.view(torch.int16)))
        return self._call(same)

    def _load_weights(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        from executors.engine.vllm_engine import reload_weights

        woke_at = time.perf_counter() if self.parking["parked"] else None
        if woke_at is not None:  # a run borrows the parked worker: its weights wake it (parking.py)
            self._wake()
        if self.rollout is not None:
            # No turn may mix KV of two versions, and vLLM resets no prefix cache under running
            # requests: in-flight rollout turns are aborted (answered "abort"; the scheduler
            # reroutes them from their prompt) so the reload lands now, never behind a turn.
            self.rollout.abort(list(self.rollout.live), "other")
            reload_weights(self.rollout.engine, tensors)
            self.rollout.drop_all_leases()
            self.rollout.version = version
        self.version = version
        if self.wiring.evict_on_burst:  # a rebuilt engine starts from the model dir
            # a copy: the worker's receiver applies the next version into `tensors` in place
            # while it pulls (storage/weights/apply_pipeline.py), and a rebuild may come
            # mid-pull (this baseline mode alone pays for the second copy)
            self._weights = (version, {n: t.clone() for n, t in tensors.items()})
        if woke_at is not None:  # rebuild + the run's weights: what a borrower waits for
            self.parking["wake_s"] = time.perf_counter() - woke_at
