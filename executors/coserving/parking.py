"""Park and wake the co-serving executor's rollout engine.

While no run holds the serving worker its rollout engine is parked: its turns are aborted, the
engine is destroyed (its KV pool and weights are given back to serving), serving's KV cap covers
the whole pool, rollout turns sent to it are answered "returned" unstarted, and `admitting()`
is False. The next run to borrow the worker wakes it: the first weights it loads
(`load_rollout_weights`, what a freshly lent worker's weight sync calls) rebuild the engine from
the cached profile (executors/coserving/memory.py, shared with the evict/reload baseline) and
load those weights into it before it takes a turn.

Destroyed, not slept, on every device: vLLM's sleep mode (`sleep(level)` / `wake_up()`) needs
CUDA's cumem allocator and an engine built with `enable_sleep_mode`; the CPU build has neither,
and the engines here are built without it (two engines share one process and device).

A mixin of CoServingExecutor (executor.py); `_park` and `_wake` run on its loop thread.
"""
from __future__ import annotations

from pathlib import Path

from executors.coserving.engines import shutdown_rollout

PARKED_HOW = "destroyed"  # see the module docstring: why not slept


def new_park_state() -> dict:
    return {"parked": False, "how": PARKED_HOW, "parks": 0, "wakes": 0, "wake_s": None,
            "pages_given_back": 0, "kv_bytes_given_back": 0, "weight_bytes_given_back": 0}


class Parking:
    def park(self) -> dict:
        """No run holds this worker: give the rollout engine's memory back to serving. Returns
        the park state (parked already, or serving_only: nothing to give back)."""
        return self._call(self._park)

    def park_state(self) -> dict:
        """parked, how, parks, wakes, the last wake's seconds, what the last park gave back."""
        return dict(self.parking)

    def _park(self) -> dict:
        r = self.rollout
        if r is None or self.parking["parked"]:
            return dict(self.parking)
        r.abort(list(r.live), "other")  # answered "abort": the scheduler reroutes them
        r.drop_all_leases()
        blocks = r.scheduler.usable_blocks()
        self.parking.update(parked=True, parks=self.parking["parks"] + 1,
                            pages_given_back=min(self.total, r.pages(blocks)),
                            kv_bytes_given_back=blocks * r.scheduler.block_bytes(),
                            weight_bytes_given_back=_weight_bytes(self.cfg.rollout_model_dir))
        shutdown_rollout(r)
        self.rollout, self._weights = None, None  # the baseline's copy of the weights goes too
        self._admitting = False
        return dict(self.parking)

    def _wake(self) -> None:
        """Rebuild the parked rollout engine (the caller loads the run's weights next)."""
        self._rebuild_rollout()
        self.parking.update(parked=False, wakes=self.parking["wakes"] + 1)


def _weight_bytes(model_dir: Path) -> int:
    """What the rollout engine loaded: its checkpoint's weight files."""
    return sum(p.stat().st_size for p in Path(model_dir).glob("*.safetensors"))
