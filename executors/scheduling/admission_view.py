"""The scheduler's cached view of each co-serving executor's admission (serving first).

`admits(name)` must be cheap (the router may ask on every decision), so it reads a flag, not
the network. Each serving worker's flag is refreshed every `refresh_s` by one pinned Dask
future of `executors.coserving.plugin.coserving_state` (its dict carries "admitting"); at most one
poll per worker is out at a time, and harvesting never blocks. Between polls two things close
the gate at once: an "abort" answer from that worker (an emergency KV cut or a stall report)
and the bound on rollout turns queued there (`max_turns`), so a burst of routing decisions
between two polls cannot pile turns onto a worker that would only stall them.

Until a poll has answered, a worker does not admit (serving first: only the executor can say yes).
"""
from __future__ import annotations

import logging
import time
from typing import Callable

from executors.coserving.plugin import coserving_state

log = logging.getLogger("rose.rollout")
# a poll's answer is a small dict on a live worker (ms); one that died holding it never comes
# (Dask reschedules the poll on the dead address): never wait long for it, the gate stays shut
POLL_FETCH_S = 1.0


class ServingAdmission:
    def __init__(self, client, names: list[str], load: Callable[[str], int],
                 max_turns: int = 16, refresh_s: float = 0.3, state_fn=None) -> None:
        if max_turns < 1:
            raise ValueError(f"max rollout turns per serving worker must be >= 1, got {max_turns}")
        if refresh_s <= 0:
            raise ValueError(f"admission refresh interval must be > 0 s, got {refresh_s}")
        self.client, self.load = client, load
        self.max_turns, self.refresh_s = max_turns, refresh_s
        self.state_fn = state_fn or coserving_state
        self.names = list(names)
        self.admitting: dict[str, bool] = {n: False for n in self.names}
        self.state: dict[str, dict] = {}
        self._poll: dict[str, object] = {}  # name -> Future in flight
        self._due: dict[str, float] = {n: 0.0 for n in self.names}

    def admits(self, name: str) -> bool:
        return self.admitting.get(name, False) and self.load(name) < self.max_turns

    def on_abort(self, name: str) -> None:
        """The worker gave a turn back (KV cut, stall): closed until its next poll says otherwise."""
        if name in self.admitting:
            self.admitting[name] = False
            self._due[name] = 0.0

    def drop(self, name: str) -> None:
        """A dead or excluded worker: stop polling it."""
        self.admitting[name] = False
        fut = self._poll.pop(name, None)
        if fut is not None:
            fut.cancel()
        self._due.pop(name, None)

    def add(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)
        self.admitting[name] = False
        self._due[name] = 0.0

    def refresh(self) -> list[str]:
        """Harvest answered polls and send due ones; return workers whose gate just opened."""
        opened, now = [], time.monotonic()
        for name, fut in list(self._poll.items()):
            if not fut.done():
                continue
            try:
                state = fut.result(timeout=POLL_FETCH_S)
            except TimeoutError as exc:
                if fut.status != "error":  # its worker died holding it: the poll stays out,
                    self.admitting[name] = False  # dropped when liveness drops the worker
                    continue
                state = exc
            except Exception as exc:  # noqa: BLE001 - the worker is going away
                state = exc
            del self._poll[name]
            if isinstance(state, Exception):  # liveness reroutes its turns
                log.warning("admission poll on %s failed: %s", name, state)
                self.admitting[name] = False
                continue
            self.state[name] = state
            was, self.admitting[name] = self.admitting[name], bool(state.get("admitting", False))
            if self.admitting[name] and not was:
                opened.append(name)
        for name, due in list(self._due.items()):
            if name not in self._poll and now >= due:
                self._due[name] = now + self.refresh_s
                self._poll[name] = self.client.submit(
                    self.state_fn, workers=[name], allow_other_workers=False, pure=False,
                    key=f"coserving-state-{name}-{time.monotonic_ns()}")
        return opened

    def pending(self):
        """Polls in flight (the dispatch loop may wake on them)."""
        return list(self._poll.values())

    def close(self) -> None:
        for name in list(self._poll):
            self._poll.pop(name).cancel()
