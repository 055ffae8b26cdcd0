"""Waiting for a full snapshot a receiver asked its publisher for: the one loop both receivers
(receiver.py, sharded_receiver.py) use.

A receiver that cannot apply what is published (a skipped version, a damaged bucket) asks the
publisher for a full snapshot through a request key in the relay and polls until a usable one is
there. The relay may lose the request (a master restart) or be unreachable for a while, and a
snapshot may itself arrive damaged. So the loop asks at once, again right after anything new
(damage seen, a newer target), and every `rerequest_s` regardless; it rides out relay errors
until the deadline; at the deadline it raises the caller's error, with the last relay error.
Repeated requests cost the publisher nothing: it pushes only when no undamaged snapshot is there.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from storage.delta import DeltaError
from storage.relay.base import RelayError, RelayKeyMissing
from storage.weights.buckets import CorruptBucket

T = TypeVar("T")

UNUSABLE = (CorruptBucket, DeltaError, RelayKeyMissing)
"""What makes a published version (or part) unusable to a receiver: take it in full instead."""


@dataclass(frozen=True)
class SnapshotWait:
    timeout_s: float
    rerequest_s: float = 2.0
    poll_s: float = 0.05

    def __post_init__(self) -> None:
        if self.timeout_s < 0 or self.rerequest_s <= 0 or self.poll_s <= 0:
            raise ValueError(f"timeout_s must be >= 0, rerequest_s and poll_s > 0; got {self}")

    def until(self, attempt: Callable[[], tuple[T | None, bool]], ask: Callable[[], None],
              give_up: Callable[[str], Exception]) -> T:
        """attempt() -> (result or None, something new seen); ask() puts the request;
        give_up(last relay error, or "") is raised at the deadline."""
        deadline = time.monotonic() + self.timeout_s
        asked_at, relay_error = -float("inf"), ""
        while True:
            try:
                result, news = attempt()
                if result is not None:
                    return result
                now = time.monotonic()
                if news or now - asked_at >= self.rerequest_s:
                    ask()
                    asked_at = now
                relay_error = ""
            except RelayError as e:  # e.g. a master restarting: wait for it within the deadline
                relay_error = f"; last relay error: {e}"
            if time.monotonic() >= deadline:
                raise give_up(relay_error)
            time.sleep(self.poll_s)
