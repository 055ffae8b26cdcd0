"""Dask worker preload for the workers that hold vLLM engines (rollout, serving).

The local stack starts those workers with `--preload executors.workers.engine_preload`: as the
process starts, a daemon thread imports vLLM's engine modules (executors/engine/preload.py),
about 10 CPU-s on this machine. The worker registers at once; the import overlaps the rest of
`rose up` (Prefect's server, the other workers) instead of running at the first `rose train`.
The rollout and co-serving plugins wait for it before they build their engines.
"""
from __future__ import annotations

from executors.engine.preload import import_engine_in_background


def dask_setup(worker) -> None:  # noqa: ARG001 - Dask's preload hook
    import_engine_in_background()
