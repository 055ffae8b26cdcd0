"""Which serving workers a run borrows for a step (called from the rollout task).

Each serving worker's load comes from its own metrics (executors/coserving/plugin.coserving_load);
the choice and the leases are executors/policies/borrow.py's, kept in the stack's lease table
(coordination/serving_leases.py) that every run's driver shares. A worker the run did not hold a
step ago missed its weight publishes: it loads the rollout's version before it takes turns (as
does a held one found parked), which wakes a parked rollout engine.
"""
from __future__ import annotations

import logging
import time

from distributed import Client

from executors.coserving.plugin import coserving_load
from executors.policies.borrow import BorrowPolicy, Grant, ServingLoad
from executors.workers.pinned import fetch_result, running_workers
from executors.workers.weight_sync import sync_weights
from core.config import RunConfig, stack_dir
from coordination.serving_leases import ServingLeases

log = logging.getLogger(__name__)
LOAD_TIMEOUT_S = 10.0  # a metrics answer is a small dict (ms) on a live worker
SYNC_TIMEOUT_S = 120.0


def stack_leases() -> ServingLeases:
    return ServingLeases(stack_dir())


def borrow_policy(cfg: RunConfig) -> BorrowPolicy:
    return BorrowPolicy(cfg.borrow.max_serving_workers, cfg.borrow.lease_ttl_s)


def serving_loads(client: Client, names: list[str]) -> tuple[list[ServingLoad], set[str]]:
    """Each serving worker's load (one that does not answer in time counts as fully loaded), and
    the workers whose rollout engine is parked."""
    live = running_workers(client)
    futures = {n: client.submit(coserving_load, workers=[live[n]], allow_other_workers=False,
                                pure=False) for n in names if n in live}
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    loads, parked = [], set()
    for name in names:
        try:
            m = fetch_result(futures[name], max(0.1, deadline - time.monotonic()))
            loads.append(ServingLoad(name, m["kv_used"], m["ttft_p99_s"], m["slo_ttft_s"]))
            if m.get("parked"):
                parked.add(name)
        except Exception as e:  # noqa: BLE001 - starting, gone, or no executor: chosen last
            log.warning("no serving load from %s (%s): it is chosen last", name, e)
            loads.append(ServingLoad.unknown(name))
    return loads, parked


def borrow_for_step(client: Client, cfg: RunConfig, serving: list[str], version: int) -> Grant:
    """Lease this step's serving workers to the run; fresh ones load policy `version` first, as
    do held ones found parked (restarted since: a serving worker starts parked). One that cannot
    is dropped from the grant, its lease given back, and the note says why."""
    loads, parked = serving_loads(client, serving)
    grant = stack_leases().grant(cfg.run_id, loads, borrow_policy(cfg))
    claim = grant.fresh + [w for w in grant.workers if w in parked and w not in grant.fresh]
    failed = claim_engines(client, cfg, claim, version)
    if failed:
        stack_leases().give_back(cfg.run_id, list(failed))
        grant = grant.without(failed)
    if grant.note:
        log.warning("run %s: %s", cfg.run_id, grant.note)
    return grant


def claim_engines(client: Client, cfg: RunConfig, fresh: list[str], version: int) -> dict[str, str]:
    """Load the run's `version` (from the worker's host copy when it holds it) into these
    workers' rollout engines before the run's turns go there: freshly lent serving workers, and
    dedicated rollout workers another run may have loaded since; worker -> why it could not."""
    live = running_workers(client)
    futures = {n: client.submit(sync_weights, cfg.stack.relay, cfg.run_id, version,
                                cfg.publish.pull_batch_bytes, SYNC_TIMEOUT_S,
                                sharded=cfg.publishes_sharded, workers=[live[n]],
                                allow_other_workers=False, pure=False)
               for n in fresh if n in live}
    failed = {n: "not running" for n in fresh if n not in live}
    for name, fut in futures.items():
        try:
            fetch_result(fut, SYNC_TIMEOUT_S + 30.0)
        except Exception as e:  # noqa: BLE001 - the step goes on without it
            failed[name] = f"could not load v{version}: {type(e).__name__}: {e}"
    return failed
