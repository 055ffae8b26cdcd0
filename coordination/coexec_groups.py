"""The stack's co-execution groups (RollMux): which runs share the rollout and trainer pools,
whose turn each pool is, and the runs' measured phase times.

One JSON file in the stack directory (<data dir>/stack/coexec_groups.json), read and changed only
under an flock (as the serving leases, coordination/serving_leases.py), so every run's driver sees
one table; admission and the round robin are executors/policies/coexec_group.py's. A member's
driver renews its membership; one silent for `ttl_s` (a driver that died) is dropped, so the
others never wait for its turns. Phase times are kept per run and per run shape (what a new run
with the same rollout, training and models is expected to take): a run's measured solo times
are its T_solo in the SLO rule.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from executors.policies.coexec_group import (POOLS, CoexecGroup, PhaseTurns, Placement, PoolLimits, RunProfile,
                                            join_group)
from coordination.run_lease import locked
from storage.atomic import write_atomic

GROUPS_FILE = "coexec_groups.json"
LOCK_FILE = "coexec_groups.lock"
log = logging.getLogger(__name__)


class CoexecGroups:
    def __init__(self, directory: Path, ttl_s: float = 60.0) -> None:
        self.directory, self.ttl_s = Path(directory), ttl_s

    @contextmanager
    def _table(self, write: bool = True) -> Iterator[dict]:
        with locked(self.directory, lock_file=LOCK_FILE):
            path = self.directory / GROUPS_FILE
            try:
                table = json.loads(path.read_text())
            except FileNotFoundError:
                table = {}
            except ValueError as e:  # hand-edited or torn: start afresh
                log.warning("ignoring unreadable co-execution groups %s: %s", path, e)
                table = {}
            table.setdefault("groups", {})
            table.setdefault("runs", {})
            table.setdefault("shapes", {})
            self._expire(table, time.time())
            yield table
            if write:
                write_atomic(path, json.dumps(table, indent=1))

    def _expire(self, table: dict, now: float) -> None:
        for name, group in list(table["groups"].items()):
            gone = [m["run"] for m in group["members"] if now - m["renewed"] > self.ttl_s]
            for run in gone:
                log.warning("co-execution group %s: run %s stopped renewing, dropped", name, run)
                self._drop(table, name, run)

    @staticmethod
    def _drop(table: dict, name: str, run: str) -> None:
        group = table["groups"][name]
        group["members"] = [m for m in group["members"] if m["run"] != run]
        group["turns"] = PhaseTurns.from_dict(group["turns"]).leave(run).to_dict()
        group["holders"] = {pool: r for pool, r in group.get("holders", {}).items() if r != run}
        if not group["members"]:
            del table["groups"][name]

    def join(self, name: str, profile: RunProfile, limits: PoolLimits) -> Placement:
        """Admit the run to group `name`, or to a group of its own (the placement says why);
        CoexecGroupError when it cannot fit even alone."""
        with self._table() as table:
            for group_name in [g for g, grp in table["groups"].items()
                               if any(m["run"] == profile.run for m in grp["members"])]:
                self._drop(table, group_name, profile.run)  # joining again (a resumed run)
            groups = [CoexecGroup(g, tuple(RunProfile(**m["profile"]) for m in grp["members"]))
                      for g, grp in table["groups"].items()]
            placed = join_group(groups, name, profile, limits)
            group = table["groups"].setdefault(placed.group, {"members": [], "turns": PhaseTurns().to_dict()})
            group["members"].append({"run": profile.run, "profile": asdict(profile), "renewed": time.time()})
            group["turns"] = PhaseTurns.from_dict(group["turns"]).join(profile.run).to_dict()
            return placed

    def leave(self, run: str) -> None:
        with self._table() as table:
            for name in [g for g, grp in table["groups"].items() if any(m["run"] == run for m in grp["members"])]:
                self._drop(table, name, run)

    def renew(self, run: str) -> None:
        with self._table() as table:
            for group in table["groups"].values():
                for m in group["members"]:
                    if m["run"] == run:
                        m["renewed"] = time.time()

    def take_turn(self, name: str, pool: str, run: str) -> bool:
        """Whether `run` may take the group's `pool` now: its turn, and the run before it gave
        the pool back (`give_back`). If so it holds the pool and the turn passes on; the pool's
        Prefect permit is then free at once (a permit waited for is retried with back-off)."""
        with self._table() as table:
            group = table["groups"].get(name)
            if group is None or not any(m["run"] == run for m in group["members"]):
                raise RuntimeError(f"run {run} is no longer in co-execution group {name} "
                                   f"(its driver stopped renewing for {self.ttl_s:g} s)")
            turns, holders = PhaseTurns.from_dict(group["turns"]), group.setdefault("holders", {})
            if holders.get(pool) not in (None, run) or turns.next(pool, {run}) != run:
                return False
            group["turns"], holders[pool] = turns.served_by(pool, run).to_dict(), run
            return True

    def give_back(self, name: str, pool: str, run: str) -> None:
        """The run's phase on `pool` is over (its permit released): the next turn may take it."""
        with self._table() as table:
            holders = table["groups"].get(name, {}).get("holders", {})
            if holders.get(pool) == run:
                del holders[pool]

    def members(self, name: str) -> list[str]:
        with self._table(write=False) as table:
            return [m["run"] for m in table["groups"].get(name, {}).get("members", [])]

    def record_phase_times(self, run: str, shape: str, rollout_s: float, train_s: float, solo: bool) -> None:
        """One step's measured phases, into the run's mean (solo or grouped); a solo step's also
        into its shape's mean, the T_solo of a new run of that shape."""
        with self._table() as table:
            means = [table["runs"].setdefault(run, {}).setdefault("solo" if solo else "grouped", {})]
            if solo:
                means.append(table["shapes"].setdefault(shape, {}))
            for mean in means:
                n = mean.get("steps", 0)
                mean.update(rollout_s=(mean.get("rollout_s", 0.0) * n + rollout_s) / (n + 1),
                            train_s=(mean.get("train_s", 0.0) * n + train_s) / (n + 1), steps=n + 1, at=time.time())

    def solo_times(self, run: str, shape: str) -> tuple[float, float] | None:
        """(rollout_s, train_s) the run took alone: its own, else a run of its shape's; None: never
        measured."""
        with self._table(write=False) as table:
            entry = table["runs"].get(run, {}).get("solo") or table["shapes"].get(shape)
        return None if entry is None else (entry["rollout_s"], entry["train_s"])

    def groups(self) -> dict[str, list[str]]:
        with self._table(write=False) as table:
            return {g: [m["run"] for m in grp["members"]] for g, grp in table["groups"].items()}

    def pools(self) -> dict[str, dict]:
        """Group -> its runs, and per pool the run holding its permit now (None: free) and whose
        turn is next (`rose status`)."""
        if not (self.directory / GROUPS_FILE).exists():
            return {}
        with self._table(write=False) as table:
            out = {}
            for name, group in table["groups"].items():
                turns, holders = PhaseTurns.from_dict(group["turns"]), group.get("holders", {})
                out[name] = {"runs": [m["run"] for m in group["members"]],
                             "pools": {pool: {"held_by": holders.get(pool), "next": turns.whose_turn(pool)}
                                       for pool in POOLS}}
            return out

    def release(self) -> None:
        """`rose down`: no run drives any more; the measured phase times stay."""
        if (self.directory / GROUPS_FILE).exists():
            with self._table() as table:
                table["groups"] = {}
