"""Serving first at the door, on real engines: a device saturated by a rollout stream, then a
burst of users at the endpoint. None is refused while the rollout is cut, the users are served
within the SLO that serving alone met on this machine in the same test, and every rollout turn
the cut took is answered "abort" (the scheduler reroutes it), not lost."""
from __future__ import annotations

import math
import shutil
import threading

import pytest

from executors.coserving.endpoint.app import start_endpoint, stop_endpoint
from executors.policies.slo_admission import slo_from_serving_alone
from fake_serving import post_all
from tests.stack_fixtures import shared_models

USERS, PROMPT, OUT = 12, 96, 24


def _burst(ep, seed: int) -> tuple[list, list]:
    bodies = [{"model": "serving", "prompt": [(seed * 31 + i * 7 + j) % 300 + 5 for j in range(PROMPT)],
               "max_tokens": OUT, "ignore_eos": True, "temperature": 0.0} for i in range(USERS)]
    return post_all(ep.url + "/v1/completions", bodies)


@pytest.mark.slow
@pytest.mark.models
def test_users_are_not_refused_while_a_saturating_rollout_is_cut(tmp_path_factory):
    import time

    from executors.coserving.executor import CoServingConfig, CoServingExecutor
    from executors.turns import TurnRequest

    src = shared_models(tmp_path_factory)
    models = tmp_path_factory.mktemp("serving-first-models")
    policy, serving = (shutil.copytree(src / n, models / n) for n in ("policy", "serving"))
    # a tight KV pool: the rollout stream takes what serving leaves, so the burst must cut it
    cfg = CoServingConfig(serving, policy, mode="rose", kv_blocks=96, max_model_len=512,
                          chunk_tokens=128, max_num_seqs=16, profile_repeats=1, stall_timeout_s=3.0,
                          usage_window_s=1.0)
    ex = CoServingExecutor(cfg, worker="first-0")
    stop, results, lock = threading.Event(), [], threading.Lock()
    try:
        ep = start_endpoint(ex, serving, worker="first-0")
        t0 = time.monotonic()
        served, refused = _burst(ep, 1)  # serving alone: the reference and the SLO it meets
        alone = [r for r in ex.served_since(t0) if r.ok]
        assert len(served) == USERS and not refused and len(alone) == USERS
        slo, how = slo_from_serving_alone([r.ttft_s for r in alone], [r.tpot_s for r in alone], ex.slo)
        ex.set_slo(slo, how)
        time.sleep(1.5)  # past the usage window: the next RL step's budget is the whole pool's
        ex.start_step()

        def keep_rollout_busy(slot: int) -> None:  # each slot: one long turn after another
            n = 0
            while not stop.is_set():
                req = TurnRequest(f"s{slot}/t{n}/a0", f"s{slot}-{n}",
                                  [(slot * 13 + j) % 300 + 5 for j in range(160)], 96, temperature=1.0)
                res = ex.submit_rollout(req).result(timeout=120)
                with lock:
                    results.append(res)
                n += 1
                if not res.ok:
                    time.sleep(0.1)  # the scheduler would place it elsewhere
        threads = [threading.Thread(target=keep_rollout_busy, args=(i,), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while ex.metrics(fresh=True)["rollout"]["used_blocks"] < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = ex.metrics(fresh=True)
        assert before["rollout"]["used_blocks"] >= 16, "the rollout stream never held the device"
        t1 = time.monotonic()
        served, refused = _burst(ep, 2)
        lent = [r for r in ex.served_since(t1)]
        stop.set()
        for t in threads:
            t.join(timeout=180)
        after = ex.metrics(fresh=True)
    finally:
        stop.set()
        stop_endpoint("first-0")
        ex.close()
    assert not refused, f"{len(refused)} users refused while rollout held the device"
    assert len(served) == USERS and len(lent) == USERS and all(r.ok for r in lent)
    met = [r.ttft_s <= slo.ttft_s and (math.isnan(r.tpot_s) or r.tpot_s <= slo.tpot_s) for r in lent]
    assert all(met), (f"{met.count(False)} of {USERS} users missed the serving-alone SLO ({how}): "
                      f"{[(round(r.ttft_s, 3), round(r.tpot_s, 3)) for r in lent]}")
    cut = after["kv"].get("cuts", 0) - before["kv"].get("cuts", 0)
    yielded = after["rollout"]["yielded_to_users"] - before["rollout"]["yielded_to_users"]
    assert cut + yielded > 0, ("the burst neither cut nor stopped the rollout", after["kv"])
    assert all(r.finished_reason in ("stop", "length", "abort", "returned") for r in results)
    assert any(r.ok for r in results)  # the rollout made progress, before and after the burst
