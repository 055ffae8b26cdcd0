"""vLLM's engine modules imported on a thread ahead of the first engine, and the wait for it.

An engine worker starts this as its process starts (executors/workers/engine_preload.py):
importing vLLM is ~10 CPU-s here, and it then overlaps the rest of `rose up` instead of
delaying the first engine build. Whoever builds an engine, or imports engine modules, in that
process calls `wait_for_engine_import()` first: two threads importing the same package tree
at once can deadlock on Python's module locks, and Python then hands one of them a partly
initialised module. Waiting makes the imports sequential. The environment must already be
the engine's when the thread starts (a stack-started worker gets it at launch:
rose/stack/dask_cluster.vllm_env).
"""
from __future__ import annotations

import importlib
import logging
import threading

ENGINE_MODULES = ("vllm.engine.arg_utils", "vllm.v1.engine.llm_engine")  # what build_engine imports

log = logging.getLogger(__name__)
_lock = threading.Lock()
_thread: threading.Thread | None = None


def import_engine_modules() -> None:
    for module in ENGINE_MODULES:
        importlib.import_module(module)


def _import() -> None:
    try:
        import_engine_modules()
    except Exception:  # noqa: BLE001 - the engine build imports again and raises where reported
        log.exception("importing vLLM ahead of the engine failed")


def import_engine_in_background() -> threading.Thread:
    """Start the import on a daemon thread, once per process."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_import, name="rose-engine-import", daemon=True)
            _thread.start()
        return _thread


def wait_for_engine_import() -> None:
    """Block until the background import (if one was started) has finished."""
    with _lock:
        thread = _thread
    if thread is not None:
        thread.join()
