"""A serving worker keeps serving its users while `rose train` borrows it (the real stack).

Slow (a few minutes): `rose up` with 1 rollout + 1 serving worker, an HTTP replay of the code
trace against the serving endpoint for the whole run, 2 RL steps in-process. Checks: turns ran
on both workers, no serving request failed, every trajectory is whole, the serving worker's
rollout engine is parked once the run ends (a turn sent there comes back unstarted), woken by the
borrow path's weight sync with the run's version (read from inside vLLM), and the summary
carries serving SLOs.
"""
from __future__ import annotations

import contextvars
import json
import threading
import uuid
from contextlib import contextmanager

import httpx
import pytest

from tests.stack_fixtures import cli_stack_env, engine_mismatches, new_data_dir, prefect_for, rose_cli

pytestmark = [pytest.mark.slow, pytest.mark.models]


@pytest.fixture(scope="module")
def serving_stack(tmp_path_factory):
    data = new_data_dir(tmp_path_factory, "rose-borrow")
    with cli_stack_env(data) as env:
        up = rose_cli(["up", "--rollout-workers", "1", "--serving-workers", "1"], env, timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        yield data, env


def test_stack_lists_its_serving_endpoint(serving_stack):
    data, env = serving_stack
    listed = rose_cli(["serve", "endpoints"], env)
    assert listed.returncode == 0, listed.stderr
    [url] = listed.stdout.split()
    stack = json.loads((data / "stack" / "stack.json").read_text())
    assert stack["endpoints"] == {"serving-0": url}
    status = rose_cli(["status"], {**env, "COLUMNS": "250"}).stdout
    assert url in status
    # no run holds serving-0 yet: `rose up` parked its rollout engine, and the endpoint serves
    assert "parked (gave back" in status, status
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    bad = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hi",
                                                    "max_tokens": -3}, timeout=10)
    assert 400 <= bad.status_code < 500 and "max_tokens" in bad.text  # and the engine lives on:
    ok = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hi",
                                                   "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4


def shed(error: str) -> bool:
    """A refusal by the endpoint's SLO admission (executors/coserving/endpoint/state.py)."""
    return "the serving endpoint is" in error


@contextmanager
def steady_user(url: str, every_s: float = 0.25):
    """One more user, beside the trace replay: a short completion every `every_s`. The trace
    is bursty (gaps of 10+ s at the replay's speed), and a step of a few seconds may fall in a
    gap; this user makes sure every step's serving window holds requests."""
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    stop, seen = threading.Event(), {"ok": 0, "errors": []}

    def loop() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.wait(every_s):
                r = http.post(f"{url}/v1/completions",
                              json={"model": model, "prompt": "def f(x):", "max_tokens": 4})
                if r.status_code == 200:
                    seen["ok"] += 1
                else:
                    seen["errors"].append((r.status_code, r.text[:200]))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=60)


def test_train_borrows_the_serving_worker_while_it_serves(serving_stack):
    from distributed import Client

    from executors.coserving.plugin import coserving_state, generate_turns_coserving
    from executors.turns import TurnRequest
    from storage.weights.digest import tensors_digest
    from executors.workers.trainer import local_trainer
    from flows.train import train
    from core.config import RolloutConfig, RunConfig
    from core.grpo import assemble_trajectory
    from replay.background import BackgroundReplay, BackgroundTraffic
    from coordination.stack_record import read_stack
    from rose.stack.local_stack import apply_env, stack_env
    from storage.trajectories.dataset import TrajectoryStore
    from tasks.borrow import claim_engines

    data, env = serving_stack
    handle = read_stack(data / "stack")
    apply_env(stack_env(handle))
    run = f"borrow-{uuid.uuid4().hex[:8]}"
    cfg = RunConfig(run_id=run, steps=2, rollout=RolloutConfig(groups=8, group_size=4, max_turns=4))
    # 32 trajectories, twice what the rollout worker takes at once: the rest is borrowed
    cfg.stack.serving_workers = 1
    url = handle.endpoints["serving-0"]
    with prefect_for(handle), steady_user(url) as steady, \
            BackgroundReplay([url], BackgroundTraffic(sample=0.5)) as users:
        summaries = train(cfg)
    served = users.summary
    # The endpoint may refuse a request at once (503 with Retry-After) when its SLO admission
    # predicts a miss: load shedding by design, which on a 2-core machine the trainer's and the
    # rollout worker's CPU use can trigger (3-5% of this replay on a slow day, with or without
    # this session's changes). Any other failure (a 500, a timeout, a cut stream) is a defect.
    assert served["requests"] > 0 and served["ok"] > 0, served
    assert all(kind.startswith("HTTP 503") and shed(kind) for kind, _ in served["error_kinds"]), served
    assert steady["ok"] > 0 and all(code == 503 and shed(text) for code, text in steady["errors"]), steady

    rows = [r for s in (1, 2)
            for r in TrajectoryStore(cfg.trajectories_dir()).read_step(run, s).to_pylist()]
    assert {r["worker"] for r in rows} == {"rollout-0", "serving-0"}, [s.get("serving") for s in summaries]
    for tid in {(r["step"], r["trajectory"]) for r in rows}:
        turns = sorted((r for r in rows if (r["step"], r["trajectory"]) == tid),
                       key=lambda r: r["turn"])
        assert [r["turn"] for r in turns] == list(range(len(turns)))  # none lost or doubled
        assert turns[-1]["done"] and not any(r["done"] for r in turns[:-1])
        assemble_trajectory([(r["prompt_ids"], r["response_ids"]) for r in turns])

    for s in summaries:
        assert s["serving_workers"] == 1 and "serving-0" in s["serving"]
        report = s["serving"]["serving-0"]
        assert report["failed"] == 0 and report["slo_ttft_s"] > 0 and report["slo_tpot_s"] > 0
    assert sum(s["serving_requests"] for s in summaries) > 0
    assert any(s["slo_attainment"] is not None for s in summaries)
    assert sum(s["by_kind"].get("serving", {}).get("turns", 0) for s in summaries) > 0

    # the run ended: no run holds serving-0, so its rollout engine is parked (destroyed on CPU)
    with Client(handle.dask_scheduler) as client:
        parked = client.submit(coserving_state, workers=["serving-0"], pure=False).result()
        turn = TurnRequest("after/t0/a0", "after", [1, 2, 3, 4], 4, seed=0)
        [returned] = client.submit(generate_turns_coserving, [turn], workers=["serving-0"],
                                   pure=False).result()
    assert parked["parked"] and not parked["rollout_up"] and not parked["admitting"], parked
    assert parked["rollout_in_flight"] == 0 and parked["pages_given_back"] > 0, parked
    assert returned.finished_reason == "returned" and returned.response_ids == []  # nothing ran
    status = rose_cli(["status"], {**env, "COLUMNS": "250"})
    assert "parked (gave back" in status.stdout, status.stdout
    # borrowed again: the borrow path's sync of a fresh worker wakes it with the run's version
    with Client(handle.dask_scheduler) as client:
        assert claim_engines(client, cfg, ["serving-0"], 2) == {}
        state = client.submit(coserving_state, workers=["serving-0"], pure=False).result()
        [again] = client.submit(generate_turns_coserving, [turn], workers=["serving-0"],
                                pure=False).result()
        published = client.submit(lambda: tensors_digest(local_trainer(run).weights_bf16()),
                                  resources={"train_gpu": 1}, pure=False).result()
    assert not state["parked"] and state["rollout_up"] and state["wake_s"] is not None, state
    print(f"serving-0 woke in {state['wake_s']:.2f} s; its park gave back {state['pages_given_back']} "
          f"pages, {state['bytes_given_back'] / 2**20:.1f} MiB")
    assert state["version"] == 2 and state["digest"] == published
    # the serving worker's rollout engine itself runs the trained weights, read from inside vLLM
    assert engine_mismatches(handle.dask_scheduler, run, "serving-0") == []
    # and it generates again, on the run's version (serving is idle: admission starts the turn)
    assert again.finished_reason in ("length", "stop") and again.response_ids, again
    assert again.policy_version == 2


@contextmanager
def watching_serving_0(scheduler: str, every_s: float = 0.3):
    """Each (run, version) serving-0's rollout engine held while lent, as lent_engine_state saw it."""
    from distributed import Client

    def lent_engine_state() -> dict | None:
        """Runs on serving-0: the run its rollout engine computes for, that run's version, and the
        names of the weights on which the engine (read from inside vLLM) differs from the run's
        host copy the worker pulled; None while parked or held by no run."""
        from distributed import get_worker

        from executors.coserving.plugin import coserving_state
        from executors.engine.weights_view import HEAD
        from executors.workers import weight_sync
        from executors.workers.rollout_worker import engine_weight_digests, weight_digests

        before = coserving_state()
        agent = weight_sync._agents.get((get_worker().id, before["run"]))
        if before["parked"] or not before["rollout_up"] or agent is None:
            return None
        engine, host = engine_weight_digests(), weight_digests(agent.receiver.tensors)
        after = coserving_state()
        if (after["run"], after["version"]) != (before["run"], before["version"]):
            return None  # a load landed meanwhile: the next look sees it
        host.setdefault(HEAD, host["model.embed_tokens.weight"])  # a tied head's GEMM copy
        return {"run": before["run"], "version": before["version"], "digest": agent.receiver.digest,
                "mismatched": sorted(n for n in set(engine) | set(host) if engine.get(n) != host.get(n))}

    stop, seen, errors = threading.Event(), {}, []

    def loop() -> None:
        with Client(scheduler) as client:
            while not stop.wait(every_s):
                try:
                    state = client.submit(lent_engine_state, workers=["serving-0"], pure=False).result(30)
                except Exception as e:  # noqa: BLE001 - busy or restarting: look again
                    errors.append(repr(e))
                    continue
                if state is not None:
                    seen.setdefault((state["run"], state["version"]), []).append(state)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield seen, errors
    finally:
        stop.set()
        thread.join(timeout=60)


def published_digest(cfg, version: int) -> str:
    """The digest of the run's bf16 weights at `version` (its checkpoint; 0: the built policy)."""
    import torch
    from transformers import AutoModelForCausalLM

    from storage.checkpoints import checkpoint_steps, load_checkpoint
    from storage.weights.digest import tensors_digest

    if version == 0:
        model = AutoModelForCausalLM.from_pretrained(cfg.models.policy_path(), dtype=torch.float32)
        state = {n: p.detach() for n, p in model.named_parameters()}
    else:
        assert version in checkpoint_steps(cfg.run_dir() / "checkpoints")
        state = load_checkpoint(cfg.run_dir() / "checkpoints" / f"step-{version:08d}").model_state
    return tensors_digest({n: t.to(torch.bfloat16).contiguous() for n, t in state.items()})


def test_two_runs_share_one_serving_worker_and_stay_apart(serving_stack):
    """Two `train` flows at once on one stack with one rollout and one serving worker: both
    complete, every trajectory lands whole in its own run's partition with that run's policy,
    serving-0 is lent to one run at a time and computes with the holding run's weights each
    time (read from inside vLLM), rollout-0 switches between the runs' host copies, and the
    background replay's users are all answered."""
    from concurrent.futures import ThreadPoolExecutor

    from distributed import Client

    from executors.workers.rollout_worker import worker_state
    from flows.train import train
    from core.config import RolloutConfig, RunConfig
    from core.grpo import assemble_trajectory
    from replay.background import BackgroundReplay, BackgroundTraffic
    from coordination.stack_record import read_stack
    from rose.stack.local_stack import apply_env, stack_env
    from storage.trajectories.dataset import TrajectoryStore

    data, env = serving_stack
    handle = read_stack(data / "stack")
    apply_env(stack_env(handle))
    tag = uuid.uuid4().hex[:6]
    # 8 trajectories per step, 4 at once on rollout-0: the rest borrowed while a run holds serving-0
    cfgs = [RunConfig(run_id=f"two-{name}-{tag}", steps=2, seed=seed,
                      rollout=RolloutConfig(groups=2, group_size=4, max_turns=2, max_concurrency_per_worker=4))
            for name, seed in (("a", 1), ("b", 2))]
    url = handle.endpoints["serving-0"]
    with prefect_for(handle), watching_serving_0(handle.dask_scheduler) as (lent, look_errors), \
            BackgroundReplay([url], BackgroundTraffic(sample=0.5)) as users, \
            ThreadPoolExecutor(2) as pool:
        # each in a copy of this context: the stack's Prefect settings (prefect_for) go with it
        futures = [pool.submit(contextvars.copy_context().run, train, cfg) for cfg in cfgs]
        summaries = {cfg.run_id: f.result() for cfg, f in zip(cfgs, futures)}
        # the run that first borrowed serving-0 kept it to its end; the other, waiting, takes it
        # with one more step (resumed from its checkpoint): the worker switches runs
        for i, cfg in enumerate(cfgs):
            if not any(s["borrow"]["workers"] for s in summaries[cfg.run_id]):
                cfgs[i] = cfg.model_copy(update={"steps": 3})
                summaries[cfg.run_id] += train(cfgs[i])
    served = users.summary
    assert served["requests"] > 0 and served["ok"] > 0, served
    assert all(kind.startswith("HTTP 503") and shed(kind) for kind, _ in served["error_kinds"]), served

    store = TrajectoryStore(cfgs[0].trajectories_dir())
    for cfg in cfgs:
        assert [s["step"] for s in summaries[cfg.run_id]] == list(range(1, cfg.steps + 1))
        for step in range(1, cfg.steps + 1):
            rows = store.read_step(cfg.run_id, step).to_pylist()
            assert {r["run"] for r in rows} == {cfg.run_id} and {r["step"] for r in rows} == {step}
            assert {r["policy_version"] for r in rows} == {step - 1}  # this run's policy, no other
            trajectories = {r["trajectory"] for r in rows}
            assert len(trajectories) == cfg.rollout.groups * cfg.rollout.group_size  # none lost
            for tid in trajectories:
                turns = sorted((r for r in rows if r["trajectory"] == tid), key=lambda r: r["turn"])
                assert [r["turn"] for r in turns] == list(range(len(turns)))
                assert turns[-1]["done"] and not any(r["done"] for r in turns[:-1])
                assemble_trajectory([(r["prompt_ids"], r["response_ids"]) for r in turns])

    # serving-0 lent to one run at a time: a step that did not get it names the run holding it
    holders = {}
    for run, steps in summaries.items():
        for s in steps:
            grant = s["borrow"]
            assert grant["workers"] == ["serving-0"] or grant["held_elsewhere"] == {
                "serving-0": next(r for r in summaries if r != run)}, grant
            holders[run, s["step"]] = grant["workers"] == ["serving-0"]
    assert {run for (run, _), held in holders.items() if held} == set(summaries), holders
    # each time it was lent, its engine computed with the holding run's weights (an earlier
    # test's run may still hold the engine when the watch starts: only these runs are checked)
    lent = {key: states for key, states in lent.items() if key[0] in summaries}
    assert {run for run, _ in lent} == set(summaries), (sorted(lent), look_errors[-3:])
    by_id = {cfg.run_id: cfg for cfg in cfgs}
    for (run, version), states in sorted(lent.items()):
        assert all(st["mismatched"] == [] for st in states), (run, version, states[0])
        assert {st["digest"] for st in states} == {published_digest(by_id[run], version)}, (run, version)
    # rollout-0 is shared: it switched between the runs, each switch a load from host memory
    def engine_switches() -> int:  # on rollout-0 (defined here: pickled by value)
        from executors.workers import weight_sync

        return sum(h.switches for h in weight_sync._holders.values())

    with Client(handle.dask_scheduler) as client:
        rollout = client.submit(worker_state, workers=["rollout-0"], pure=False).result()
        switches = client.submit(engine_switches, workers=["rollout-0"], pure=False).result()
    assert switches >= 2, switches
    holder = by_id[rollout["run"]]
    assert rollout["version"] == holder.steps  # the run that rolled out last, at its last version
    assert engine_mismatches(handle.dask_scheduler, holder.run_id) == []


def test_a_killed_serving_worker_comes_back_at_its_endpoint(serving_stack):
    """The serving worker's process as `rose status` lists it (its nanny) SIGKILLed: the
    stack's supervisor (rose/stack/supervisor.py) restarts it, the co-serving plugin the
    scheduler holds builds its engines again, and the endpoint answers at the same URL."""
    import os
    import signal
    import time

    import psutil

    from coordination.stack_record import read_stack

    data, env = serving_stack
    before = read_stack(data / "stack")
    url = before.endpoints["serving-0"]
    nanny = next(p.pid for p in before.processes if p.name == "worker-serving-0")
    family = [nanny, *(c.pid for c in psutil.Process(nanny).children(recursive=True))]
    t0 = time.monotonic()
    os.kill(nanny, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(p) for p in family if psutil.pid_exists(p)], timeout=30)
    down_at = time.monotonic() - t0  # its worker went with it: the endpoint is down
    assert not _answers(url)
    while not _answers(url):
        assert time.monotonic() - t0 < 120, "the serving endpoint never answered again"
        time.sleep(0.2)
    answered_s = time.monotonic() - t0
    print(f"serving-0 killed: endpoint down after {down_at:.1f} s, answering again after "
          f"{answered_s:.1f} s")
    assert answered_s < 90  # ~20 s on an idle 2-core machine (docs/reliability.md)
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    ok = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "hi",
                                                   "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4

    after = read_stack(data / "stack")
    [restart] = [r for r in after.restarts if r["service"] == "worker-serving-0"]
    assert restart["exit_code"] == -signal.SIGKILL and restart["restart"] == 1
    assert {p.name: p.pid for p in after.processes}["worker-serving-0"] == restart["pid"] != nanny
    assert after.endpoints == before.endpoints
    status = rose_cli(["status"], env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "worker-serving-0" in status.stdout and "Restarts by the supervisor" in status.stdout


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
