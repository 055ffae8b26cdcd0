"""Co-execution groups in the train flow (`rose train --group NAME`; RollMux): runs in one group
share the rollout and trainer workers, and each RL step's two phases take permits in turn:

  rollout phase (rollout + reward)   permit of the Prefect global concurrency limit
                                     `rose-group-NAME-rollout` (1 slot, visible in the Prefect UI)
  train phase (train + publish)      `rose-group-NAME-train`

A run waits for its turn on the pool (executors/policies/coexec_group.PhaseTurns: strict
round robin within the group, kept in the stack's table, coordination/coexec_groups.py), then for
the permit; so run A rolls out while run B trains. The rollout driver runs on the trainer worker
by name, not by its one `train_gpu` resource (which another run's train phase holds meanwhile).
Another run's weights stay in each worker's host memory while one run holds the engine
(executors/workers/weight_sync.py): a switch is a warm start from there.

Admission (at the run's start) is the policy's: residency (every member's parked state fits each
pool's host memory: its bf16 weights on the rollout pool; fp32 weights, AdamW state and a bf16
snapshot on the trainer pool) and the SLO rule T_co <= coexec.slo_factor x T_solo from the runs'
measured solo phase times (per run, else per run shape: the mean of steps 2 on of runs trained
in no group). A run refused goes to a group of its own and says so; one that cannot fit even
alone is an error naming the run and the memory.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from executors.policies.coexec_group import ROLLOUT, TRAIN, CoexecGroupError, Placement, PoolLimits, RunProfile
from core.config import RunConfig, stack_dir
from coordination.coexec_groups import CoexecGroups

POOLS = (ROLLOUT, TRAIN)
log = logging.getLogger(__name__)
TURN_POLL_S = 0.1
ASSUMED_PHASE_S = 1.0  # a shape never measured: admitted on residency, SLO checked once measured


@dataclass
class Membership:
    run: str
    group: str
    placement: Placement
    trainer: str  # Dask worker name the phases are pinned to
    measured: bool  # the run's solo phase times were known at admission
    waited_s: dict[str, float] = field(default_factory=dict)  # pool -> this step's wait for its turn

    @property
    def placement_annotations(self) -> dict:
        return {"workers": [self.trainer], "allow_other_workers": False}


_active: dict[str, Membership] = {}  # run -> its group membership, in this (driver) process


def limit_name(group: str, pool: str) -> str:
    return f"rose-group-{group}-{pool}"


def run_shape(cfg: RunConfig) -> str:
    """What a run's phase times depend on: its rollout, training and models."""
    keys = {"rollout": cfg.rollout.model_dump(mode="json"), "train": cfg.train.model_dump(mode="json"),
            "models": cfg.models.model_dump(mode="json"), "reward": cfg.reward.model_dump(mode="json")}
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]


def parked_bytes(cfg: RunConfig) -> tuple[int, int]:
    """(rollout pool, trainer pool) host memory the run's parked state takes: its bf16 weights
    on each rollout worker; fp32 weights + AdamW's two moments + a bf16 snapshot on the trainer."""
    from safetensors import safe_open

    params = 0
    for path in sorted(cfg.models.policy_path().glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                shape = f.get_slice(name).get_shape()
                params += math.prod(shape)
    return 2 * params, (4 + 8 + 2) * params


def pool_limits(cfg: RunConfig) -> PoolLimits:
    if cfg.coexec.host_memory_gib is not None:
        have = int(cfg.coexec.host_memory_gib * 2**30)
    else:
        import psutil

        have = int(psutil.virtual_memory().available)
    return PoolLimits(have, have)


def run_profile(cfg: RunConfig, groups: CoexecGroups) -> tuple[RunProfile, bool]:
    """The run's profile for admission, and whether its phase times were measured."""
    times = groups.solo_times(cfg.run_id, run_shape(cfg))
    rollout_b, train_b = parked_bytes(cfg)
    rollout_s, train_s = times or (ASSUMED_PHASE_S, ASSUMED_PHASE_S)
    return RunProfile(cfg.run_id, rollout_s, train_s, rollout_b, train_b, cfg.coexec.slo_factor), times is not None


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _memory_source(cfg: RunConfig) -> str:
    return "coexec.host_memory_gib" if cfg.coexec.host_memory_gib is not None else "free on this host"


def ensure_limits(group: str) -> None:
    """One slot per pool: the group's Prefect global concurrency limits (upserted)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        for pool in POOLS:
            try:
                client.upsert_global_concurrency_limit_by_name(limit_name(group, pool), 1)
            except ObjectAlreadyExists:  # a group-mate created it meanwhile (upsert is not atomic)
                client.upsert_global_concurrency_limit_by_name(limit_name(group, pool), 1)


@contextmanager
def membership(cfg: RunConfig, trainer: str) -> Iterator[Membership | None]:
    """The run's place in its co-execution group while the block runs (None: no --group)."""
    if not cfg.coexec.group:
        yield None
        return
    groups = CoexecGroups(stack_dir(), cfg.coexec.member_ttl_s)
    profile, measured = run_profile(cfg, groups)
    limits = pool_limits(cfg)
    try:
        placed = groups.join(cfg.coexec.group, profile, limits)
    except CoexecGroupError as e:  # not even alone: the memory in units that show it
        raise CoexecGroupError(
            f"run {cfg.run_id} cannot fit co-execution group {cfg.coexec.group} nor one of its own: its "
            f"parked state takes {_size(profile.rollout_parked_bytes)} of rollout-pool and "
            f"{_size(profile.train_parked_bytes)} of trainer-pool host memory, each pool has "
            f"{_size(limits.rollout_host_bytes)} ({_memory_source(cfg)}); {e}") from None
    member = Membership(cfg.run_id, placed.group, placed, trainer, measured)
    stop = threading.Event()
    beat = threading.Thread(target=_renew_until, args=(groups, cfg.run_id, cfg.coexec.member_ttl_s / 4, stop),
                            daemon=True, name=f"coexec-{cfg.run_id}")
    try:
        ensure_limits(placed.group)
        _say(describe(member, groups), refused=bool(placed.reason))
        beat.start()
        _active[cfg.run_id] = member
        yield member
    finally:
        _active.pop(cfg.run_id, None)
        stop.set()
        if beat.is_alive():
            beat.join(5)
        groups.leave(cfg.run_id)


def describe(member: Membership, groups: CoexecGroups) -> str:
    p = member.placement
    where = (f"run {p.run} joined co-execution group {p.group} (with {', '.join(groups.members(p.group))})"
             if not p.reason else f"run {p.run} runs in a group of its own ({p.group}): {p.reason}")
    times = ", ".join(f"{r} {t:.1f} s" for r, t in sorted(p.step_times.items()))
    note = "" if member.measured else "; no solo phase times measured for its shape yet: SLO checked on residency only"
    return f"{where}; step times in the round robin: {times}{note}"


def _say(message: str, refused: bool) -> None:
    """In the flow run's log (a refusal as a warning: the CLI's live view shows warnings)."""
    try:
        from prefect import get_run_logger

        logger = get_run_logger()
    except Exception:  # noqa: BLE001 - outside a flow run (tests, tools)
        logger = log
    (logger.warning if refused else logger.info)(message)


def _renew_until(groups: CoexecGroups, run: str, every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        try:
            groups.renew(run)
        except Exception as e:  # noqa: BLE001 - a slow shared filesystem: the next beat tries again
            log.warning("run %s: renewing its co-execution membership failed: %s", run, e)


def active(run: str) -> Membership | None:
    return _active.get(run)


@contextmanager
def phase_permit(run: str, pool: str) -> Iterator[None]:
    """The run's turn on `pool` in its group, then the pool's Prefect permit, for the block;
    no group: nothing to wait for."""
    member = _active.get(run)
    if member is None:
        yield
        return
    from prefect.concurrency.sync import concurrency

    groups = CoexecGroups(stack_dir())
    t0 = time.perf_counter()
    while not groups.take_turn(member.group, pool, run):
        time.sleep(TURN_POLL_S)
    try:
        with concurrency(limit_name(member.group, pool), occupy=1, strict=True):
            member.waited_s[pool] = time.perf_counter() - t0
            yield
    finally:  # after the permit's release: the next run's permit is free when it takes the pool
        groups.give_back(member.group, pool, run)


def record_step(cfg: RunConfig, step: int, rollout_s: float, train_s: float) -> None:
    """The step's phase times into the stack's table; a run not in a group measures T_solo (of
    the run and its shape). Step 1 is left out: engine warm-up and the run's first publish."""
    if step < 2:
        return
    try:
        groups = CoexecGroups(stack_dir())
        groups.record_phase_times(cfg.run_id, run_shape(cfg), rollout_s, train_s, solo=not cfg.coexec.group)
    except (OSError, TimeoutError) as e:  # the step's own results matter more
        log.warning("run %s: its phase times were not recorded: %s", cfg.run_id, e)
