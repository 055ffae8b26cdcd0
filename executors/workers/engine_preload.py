"""Dask worker preload for the workers that hold vLLM engines (rollout, serving).

The local stack starts those workers with `--preload executors.workers.engine_preload`: as the
process starts, a daemon thread imports vLLM's engine modules (executors.engine.vllm_engine),
about 10 CPU-s on this machine. The worker registers at once; the import overlaps the rest of
`rose up` (Prefect's server, the other workers) instead of running at the first `rose train`,
when the rollout plugin builds its engine (that import then finds the modules loaded, or
waits for the thread's import to finish: Python's import lock). A failed import is logged
and left for the engine build to raise where it is reported.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


def import_engine_modules() -> None:
    # imported here, not at the top: the nanny imports this module too, and needs no torch
    from executors.engine.vllm_engine import import_engine_modules as load

    load()


def _import() -> None:
    try:
        import_engine_modules()
    except Exception:  # noqa: BLE001 - the engine build raises it again where it is reported
        log.exception("importing vLLM ahead of the engine failed")


def dask_setup(worker) -> None:  # noqa: ARG001 - Dask's preload hook
    threading.Thread(target=_import, name="rose-engine-import", daemon=True).start()
