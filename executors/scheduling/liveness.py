"""Liveness of the workers a rollout routes to, read from the Dask scheduler (its heartbeats).

Dask workers heartbeat to the scheduler, and the scheduler drops a worker at once when its
connection closes (process killed) or after missed heartbeats. A restarted worker (its nanny
brings it back) keeps its NAME but gets a new address and fresh state: a new incarnation, with
no prefix cache and policy version 0. So a worker is tracked by (name, address): a name that
vanished or changed address is lost; a name that shows up again at a new address has returned.

`poll()` asks the scheduler at most every `every_s` seconds (one RPC, a few ms), so the
dispatch loop can call it on each wake-up.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class LivenessEvents:
    lost: list[str] = field(default_factory=list)  # gone, or replaced by a new incarnation
    returned: list[str] = field(default_factory=list)  # a new incarnation of a lost worker


class WorkerLiveness:
    def __init__(self, client, names, every_s: float = 0.5) -> None:
        if every_s <= 0:
            raise ValueError(f"liveness check interval must be > 0 s, got {every_s}")
        self.client, self.every_s = client, every_s
        self._address: dict[str, str] = {}  # name -> address of the incarnation we route to
        self._lost: dict[str, str] = {}  # name -> address of the incarnation that was lost
        current = self.addresses()
        missing = sorted(n for n in names if n not in current)
        if missing:
            raise RuntimeError(f"workers {missing} are not connected to the Dask scheduler")
        self._address = {n: current[n] for n in names}
        self._next = time.monotonic() + every_s

    def addresses(self) -> dict[str, str]:
        """Name -> address of every running worker the scheduler knows now."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        return {str(w.get("name")): addr for addr, w in info.items()
                if w.get("status", "running") == "running"}

    def address(self, name: str) -> str | None:
        return self._address.get(name)

    def poll(self, force: bool = False) -> LivenessEvents:
        """Lost and returned workers since the last poll; empty between checks."""
        now = time.monotonic()
        if not force and now < self._next:
            return LivenessEvents()
        self._next = now + self.every_s
        return self.update(self.addresses())

    def update(self, current: dict[str, str]) -> LivenessEvents:
        events = LivenessEvents()
        for name, address in list(self._address.items()):
            if current.get(name) != address:
                events.lost.append(name)
                self._lost[name] = self._address.pop(name)
        for name, old in list(self._lost.items()):
            new = current.get(name)
            if new is not None and new != old:
                events.returned.append(name)
                del self._lost[name]
                self._address[name] = new
        return events
