"""Serving workers get one Dask future per turn, and a waiting turn does not hold a Dask thread.

A fake co-serving executor answers each turn after its own delay, on a 1-thread worker: the
short turns come back before the long one (no head-of-line blocking), and all of them wait
at once (generate_turns_coserving secedes from the worker's thread pool while it waits).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from distributed import Client, LocalCluster

from executors.coserving.plugin import PLUGIN, generate_turns_coserving
from executors.turns import TurnRequest, TurnResult


class _SlowExecutor:
    """Answers a turn after the seconds its max_tokens names (tenths)."""

    def submit_rollout(self, req: TurnRequest) -> Future:
        fut: Future = Future()

        def answer() -> None:
            time.sleep(req.max_tokens / 10)
            fut.set_result(TurnResult(req.request_id, req.trajectory_id, [1], [0.0], "stop",
                                      "serving-0", "serving", 0, len(req.prompt_ids)))
        threading.Thread(target=answer, daemon=True).start()
        return fut


class _Plugin:
    name = PLUGIN
    executor = _SlowExecutor()
    run: str | None = None  # no training run holds the rollout side: turns of any run compute


def _install(dask_worker) -> None:
    dask_worker.plugins[PLUGIN] = _Plugin()


def test_turns_on_a_serving_worker_come_back_one_by_one_without_holding_threads():
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cl, \
            Client(cl) as client:
        client.run(_install)
        reqs = [TurnRequest(f"t{i}/t0/a0", f"t{i}", [5, 6], n) for i, n in enumerate((10, 2, 2, 2))]
        futs = [client.submit(generate_turns_coserving, [r], pure=False) for r in reqs]
        short = futs[1].result(timeout=30)
        # back before the 1 s turn: on one thread without secede it would wait for it
        assert short[0].ok and not futs[0].done()
        assert all(f.result(timeout=30)[0].ok for f in futs)
