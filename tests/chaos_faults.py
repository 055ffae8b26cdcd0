"""The chaos bench's faults, injected from outside the product: SIGKILL by pid (from the stack
file, or asked of the Dask worker itself), relay objects overwritten through the relay's own
client, `rose down` from another process. Each fault waits for its phase, strikes once and
records what it did; nothing in the product knows about it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import psutil
from distributed import Client

from tests.chaos_stack import Bed, Outcome, Progress
from tests.chaos_watch import (freeze_new_child, kill_pid, pull_records, scheduler_of,
                               wait_checkpoint, wait_task)
from tests.faults import KillMidRollout

Inject = Callable[[Bed, Progress, dict], None]
After = Callable[[Bed, Outcome, dict], Outcome]


@dataclass
class Fault:
    key: str
    title: str
    where: str
    inject: Inject
    stack: dict = field(default_factory=lambda: {"rollout_workers": 2})
    after: After | None = None  # follow-up once the train command returned (e.g. resume)
    deadline_s: float = 900.0  # the train command (and each follow-up) is killed after this
    serving: bool = False  # a replay drives the serving endpoint while the run trains
    steps: int | None = None  # the run's steps, when not the bench's --steps


def kill_serving(bed: Bed, progress: Progress, record: dict) -> None:
    """SIGKILL serving-0 and its nanny once it has run a rollout turn batch lent to the run
    and runs another, while the replay runs and 4 long streaming requests are in flight on
    its endpoint (they must fail at the client, promptly: never hang); then time how long its
    endpoint takes to answer again (the stack's supervisor restarts it)."""
    from tests.chaos_serving import InFlightProbes

    with Client(scheduler_of(bed), timeout=30) as client:
        wait_task(client, "serving-0", "generate_turns", 600)  # lent to the rollout now
    probes = InFlightProbes(bed.stack()["endpoints"]["serving-0"])
    probes.wait_streaming()
    kill = KillMidRollout(scheduler_of(bed), "serving-0", after_batches=0, with_nanny=True,
                          timeout_s=600)
    kill.run()
    if kill.error is not None:
        raise kill.error
    progress.injected()
    record.update(kill.killed)
    # the stack's supervisor restarts it (rose/stack/supervisor.py): kill -> /health answers
    from tests.chaos_serving import wait_answering

    record["endpoint_back_s"] = wait_answering(bed.stack()["endpoints"]["serving-0"],
                                               kill.killed["at"])
    record.update(probes.report(kill.killed["at"]))


def serving_weights_after(bed: Bed, out: Outcome, record: dict) -> Outcome:
    """Once the run is over: the policy version and weights digest the restarted serving
    worker's rollout engine holds (it re-attached to the run and pulled its weights if it
    equals the final checkpoint's)."""
    from executors.coserving.plugin import coserving_state

    try:
        with Client(scheduler_of(bed), timeout=30) as client:
            state = client.submit(coserving_state, workers=["serving-0"], pure=False).result(60)
        record["serving_after"] = {k: state.get(k) for k in ("version", "digest", "endpoint")}
    except Exception as e:  # noqa: BLE001 - the row says it could not be read
        record["serving_after"] = {"error": f"{type(e).__name__}: {e}"[:200]}
    return out


def kill_rollout(with_nanny: bool, freeze_restart: bool = False) -> Inject:
    """SIGKILL rollout-1 mid-rollout (with its nanny, or not). `freeze_restart`: SIGSTOP the
    process the nanny starts in its place as soon as it appears: a restart that never
    completes (a worker half-started for good)."""
    def inject(bed: Bed, progress: Progress, record: dict) -> None:
        nanny = bed.pid_of("worker-rollout-1")  # `dask worker --nanny` is the nanny process
        before = {p.pid for p in psutil.Process(nanny).children()}
        kill = KillMidRollout(scheduler_of(bed), "rollout-1", after_batches=2,
                              with_nanny=with_nanny, timeout_s=600)
        kill.run()  # in this (the fault's) thread
        if kill.error is not None:
            raise kill.error
        progress.injected()
        record.update(kill.killed)
        if freeze_restart:
            record["frozen_pid"] = freeze_new_child(nanny, before | {kill.killed["pid"]})
    return inject


def kill_service(service: str, task_prefix: str, after_step: int = 0) -> Inject:
    """SIGKILL a stack service (its pid from the stack file) once the trainer runs a task of
    `task_prefix` after step `after_step` checkpointed."""
    def inject(bed: Bed, progress: Progress, record: dict) -> None:
        if after_step:
            wait_checkpoint(bed, after_step)
        with Client(scheduler_of(bed), timeout=30) as client:
            wait_task(client, "trainer-0", task_prefix, 600)
        pid = bed.pid_of(service)
        kill_pid(pid)
        progress.injected()
        record.update(worker=service, pid=pid, at=time.time())
    return inject


def corrupt_bucket(bed: Bed, progress: Progress, record: dict) -> None:
    """Overwrite bucket 0 of version 1 (step 1's delta) with other bytes of its size as soon
    as its manifest is in the relay, before the engines pull it; then read back from each
    engine worker how its pull of v1 went."""
    from storage.relay.mooncake import MooncakeRelay
    from storage.weights.versions import bucket_key, manifest_key

    stack = bed.stack()
    relay = MooncakeRelay(stack["mooncake_master"], stack["mooncake_metadata_url"],
                          segment_bytes=64 << 20)
    bed.keep = relay  # the overwritten object lives in this client's segment: keep it open
    manifest, bucket = manifest_key(bed.run_id, 1), bucket_key(bed.run_id, 1, 0)
    deadline = time.monotonic() + 600
    while not relay.exists(manifest):
        if time.monotonic() > deadline:
            raise TimeoutError("version 1 was never published")
        time.sleep(0.002)
    good = relay.get(bucket)
    relay.put(bucket, bytes(b ^ 0xFF for b in good[:64]) + good[64:])  # same size, new bits
    progress.injected()
    record.update(key=bucket, bytes=len(good), at=time.time())
    record["pulls"] = pull_records(bed, version=1)


def down_mid_step(bed: Bed, progress: Progress, record: dict) -> None:
    """`rose down` (SIGTERM to every service) while step 2's rollout runs."""
    wait_checkpoint(bed, 1)
    with Client(scheduler_of(bed), timeout=30) as client:
        wait_task(client, "trainer-0", "rollout-", 600)
    progress.injected()
    record.update(at=time.time(), down_rc=bed.down().rc)


def flood_endpoint(bed: Bed, progress: Progress, record: dict) -> None:
    """1,000 concurrent streaming clients on serving-0's endpoint while step 1 rolls out."""
    from tests.chaos_flood import flood

    stack = bed.stack()
    with Client(stack["dask_scheduler"], timeout=30) as client:
        wait_task(client, "trainer-0", "rollout-", 600)
    progress.injected()
    record.update(at=time.time(), **flood(stack["dask_scheduler"], "serving-0",
                                          stack["endpoints"]["serving-0"]))


def kill_trainer_mid_train(bed: Bed, progress: Progress, record: dict) -> None:
    """SIGKILL the trainer's worker process (its nanny restarts it) while step 2 trains."""
    nanny = bed.pid_of("worker-trainer-0")
    wait_checkpoint(bed, 1)
    with Client(scheduler_of(bed), timeout=30) as client:
        wait_task(client, "trainer-0", "train-", 600)
    [worker] = [c.pid for c in psutil.Process(nanny).children()
                if "resource_tracker" not in " ".join(c.cmdline())]
    kill_pid(worker)
    progress.injected()
    record.update(worker="trainer-0", pid=worker, nanny_pid=nanny, at=time.time())


def second_driver(bed: Bed, progress: Progress, record: dict) -> None:
    """`rose resume` of the run while `rose train` drives it (step 1's rollout): refused, with
    the holder of the run lease named; the first driver goes on undisturbed."""
    with Client(scheduler_of(bed), timeout=30) as client:
        wait_task(client, "trainer-0", "rollout-", 600)
    progress.injected()
    record["at"] = time.time()
    second = bed.rose(["resume", bed.run_id], 300)
    said = second.tail(400)
    record.update(second_rc=second.rc, second_s=round(second.seconds, 1), second_said=said)
    if second.rc in (0, None) or "being driven by another driver" not in said:
        raise RuntimeError(f"the second driver was not refused (rc {second.rc}): {said}")


def resume_if_failed(up_first: bool) -> After:
    """The operator's recovery: (`rose up`, then) `rose resume <run>` when the run failed."""
    def after(bed: Bed, out: Outcome, record: dict) -> Outcome:
        record["train_rc"] = out.rc
        if "at" in record and out.rc != 0:  # how long the failed driver took to give up
            record["train_gave_up_s"] = round(time.time() - record["at"], 1)
        if out.rc == 0 or out.hung:
            return out
        if up_first:
            bed.up()
        resumed = bed.rose(["resume", bed.run_id], 900)
        record["resumed"] = resumed.rc
        return resumed
    return after


FAULTS: list[Fault] = [
    Fault("1", "rollout worker process killed, nanny alive", "rollout, step 1, 3rd turn batch",
          kill_rollout(with_nanny=False)),
    Fault("1b", "rollout worker process killed, its restart hangs",
          "rollout, step 1, 3rd turn batch; the new process frozen as it starts",
          kill_rollout(with_nanny=False, freeze_restart=True), deadline_s=600),
    Fault("2", "rollout worker killed with its nanny", "rollout, step 1, 3rd turn batch",
          kill_rollout(with_nanny=True)),
    Fault("3", "serving worker killed while serving a replay (6 steps)",
          "rollout, turns lent to serving-0, 4 requests streaming", kill_serving,
          stack={"rollout_workers": 1, "serving_workers": 1}, serving=True,
          after=serving_weights_after, steps=6),  # a run that outlives the restart
    Fault("5", "Mooncake master killed mid-publish", "publish, step 1",
          kill_service("mooncake-master", "publish-"),
          after=resume_if_failed(up_first=False)),
    Fault("5b", "Mooncake store client killed mid-publish (the versions die with it)",
          "publish, step 1", kill_service("mooncake-store-client", "publish-"),
          after=resume_if_failed(up_first=False)),
    Fault("6", "a bucket corrupted in the relay", "publish, step 1: bucket 0 of v1 before "
          "the engines pull it", corrupt_bucket),
    Fault("4", "trainer killed mid-train (nanny restarts it)", "train, step 2",
          kill_trainer_mid_train, after=resume_if_failed(up_first=False)),
    Fault("7", "Prefect server killed mid-run", "train, step 2 (its rollout done)",
          kill_service("prefect-server", "train-", after_step=1),
          after=resume_if_failed(up_first=False)),
    Fault("8", "`rose down` mid-step, `rose up`, `rose resume`", "rollout, step 2",
          down_mid_step, after=resume_if_failed(up_first=True)),
    Fault("9", "a second driver on a running run (`rose resume`)",
          "rollout, step 1", second_driver),
    Fault("10", "endpoint flooded: 1,000 concurrent streaming clients",
          "rollout, step 1", flood_endpoint,
          stack={"rollout_workers": 1, "serving_workers": 1}),
]
