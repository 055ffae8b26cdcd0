"""What the serving workers saw over an RL step: their requests, P99s and SLO attainment, and
the rollout turns their executors admitted and aborted.

The step's window opens when its rollout starts (tasks/rollout.py starts each serving worker's
step) and closes here, after publish: serving over the whole step, the weight pull included.
A serving worker that is gone or still starting reports nothing; the step never waits on it.
"""
from __future__ import annotations

import logging

from prefect import task

from executors.coserving.plugin import coserving_step_report
from tasks.placement import workers_by_kind
from tasks.worker_threads import client_outside_thread_pool

log = logging.getLogger(__name__)


@task(name="serving-report", retries=0)
def serving_report(timeout_s: float = 30.0) -> dict:
    """{"serving": worker -> report, "serving_requests", "slo_attainment", "serving_workers"}."""
    with client_outside_thread_pool() as client:
        names = sorted(n for n, k in workers_by_kind(client).items() if k == "serving")
        reports = []
        for name in names:
            try:
                reports.append(client.submit(coserving_step_report, workers=[name],
                                             allow_other_workers=False,
                                             pure=False).result(timeout=timeout_s))
            except Exception as e:  # noqa: BLE001 - a step never fails on a serving report
                log.warning("no serving report from %s: %s", name, e)
    return {**serving_summary(reports), "serving_workers": len(names)}


def serving_summary(reports: list[dict | None]) -> dict:
    """Per serving worker over the step, and the SLO attainment over all their requests."""
    workers = {r["worker"]: r for r in reports if r}
    requests = sum(r["requests"] for r in workers.values())
    met = sum(r["slo_met"] for r in workers.values())
    return {"serving": workers, "serving_requests": requests,
            "slo_attainment": met / requests if requests else None}
