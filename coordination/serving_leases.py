"""The stack's serving-worker leases: which run holds which borrowed serving worker.

One JSON file in the stack directory (<data dir>/stack/serving_leases.json), read and changed
only under an flock (as the run lease, coordination/run_lease.py), so every run's driver and its
rollout task on the trainer see one table; the decisions are executors/policies/borrow.py's.
A run's driver renews its leases every ttl / 4 (`borrowing`) and releases them when the run
ends; `rose down` releases every lease; a driver that died stops renewing and its leases lapse.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from executors.policies.borrow import BorrowPolicy, Grant, LeaseTable, ServingLoad
from coordination.run_lease import locked
from storage.atomic import write_atomic

LEASES_FILE = "serving_leases.json"
LOCK_FILE = "serving_leases.lock"
log = logging.getLogger(__name__)


class ServingLeases:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    @contextmanager
    def _table(self, write: bool = True) -> Iterator[LeaseTable]:
        with locked(self.directory, lock_file=LOCK_FILE):
            path = self.directory / LEASES_FILE
            try:
                table = LeaseTable.from_dict(json.loads(path.read_text()))
            except FileNotFoundError:
                table = LeaseTable()
            except (ValueError, TypeError) as e:  # hand-edited or torn: start afresh
                log.warning("ignoring unreadable serving leases %s: %s", path, e)
                table = LeaseTable()
            yield table
            if write:
                write_atomic(path, json.dumps(table.to_dict(), indent=1))

    def grant(self, run: str, loads: list[ServingLoad], policy: BorrowPolicy) -> Grant:
        with self._table() as table:
            return table.grant(run, loads, policy, time.time())

    def renew(self, run: str) -> list[str]:
        with self._table() as table:
            return table.renew(run, time.time())

    def release(self, run: str | None = None) -> dict[str, str]:
        """Free the run's leases (all leases: None); worker -> run freed."""
        if run is None and not (self.directory / LEASES_FILE).exists():
            return {}
        with self._table() as table:
            return table.release(run)

    def give_back(self, run: str, workers: list[str]) -> dict[str, str]:
        """Free these workers if the run holds them (lent, then unable to take its turns)."""
        with self._table() as table:
            return table.release(run, workers)

    def holders(self) -> dict[str, str]:
        """Serving worker -> the run holding it now (lapsed leases excluded; `rose status`)."""
        if not (self.directory / LEASES_FILE).exists():
            return {}
        with self._table(write=False) as table:
            table.expire(time.time())
            return {w: lease.run for w, lease in table.leases.items()}

    def held_by(self, run: str) -> list[str]:
        """The serving workers the run holds now (lapsed leases excluded)."""
        with self._table(write=False) as table:
            table.expire(time.time())
            return table.held_by(run)


@contextmanager
def borrowing(leases: ServingLeases, run: str, ttl_s: float) -> Iterator[ServingLeases]:
    """For the run's driver: renew its leases every ttl_s / 4 while the block runs, release them
    when it ends (normally or not)."""
    stop = threading.Event()
    beat = threading.Thread(target=_renew_until, args=(leases, run, ttl_s / 4, stop), daemon=True,
                            name=f"serving-leases-{run}")
    with ExitStack() as on_exit:  # run last-in first: stop renewing, then release
        on_exit.callback(_release, leases, run)
        on_exit.callback(beat.join, 5)
        on_exit.callback(stop.set)
        beat.start()
        yield leases


def _renew_until(leases: ServingLeases, run: str, every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        try:
            leases.renew(run)
        except Exception as e:  # a slow shared filesystem: try again at the next beat
            log.warning("run %s: renewing its serving leases failed: %s", run, e)


def _release(leases: ServingLeases, run: str) -> None:
    freed = leases.release(run)
    if freed:
        log.info("run %s released serving workers %s", run, ", ".join(sorted(freed)))
