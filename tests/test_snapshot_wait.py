"""The one wait-for-a-full-snapshot loop both receivers use (storage/weights/snapshot_wait.py):
when it asks, that it rides out relay errors, and what it says when it gives up."""
from __future__ import annotations

import time

import pytest

from storage.relay.base import RelayError
from storage.weights.snapshot_wait import SnapshotWait


class _Script:
    """attempt() answers from a script of (result, news) or exceptions; ask() is counted."""

    def __init__(self, steps: list) -> None:
        self.steps, self.asks, self.at = list(steps), [], 0

    def attempt(self):
        self.at += 1
        step = self.steps.pop(0) if self.steps else (None, False)
        if isinstance(step, Exception):
            raise step
        return step

    def ask(self) -> None:
        self.asks.append(self.at)


def test_asks_at_once_and_again_right_after_news_not_on_every_poll() -> None:
    s = _Script([(None, False), (None, False), (None, True), (None, False), ("done", False)])
    wait = SnapshotWait(timeout_s=10, rerequest_s=60, poll_s=0.001)
    assert wait.until(s.attempt, s.ask, lambda err: AssertionError(err)) == "done"
    assert s.asks == [1, 3]  # the first look, and the look that saw damage or a newer target


def test_asks_again_every_rerequest_s_in_case_the_relay_lost_the_request() -> None:
    s = _Script([])
    wait = SnapshotWait(timeout_s=0.35, rerequest_s=0.1, poll_s=0.01)
    with pytest.raises(TimeoutError):
        wait.until(s.attempt, s.ask, lambda err: TimeoutError(err))
    assert 3 <= len(s.asks) <= 5  # at 0, ~0.1, ~0.2, ~0.3 s


def test_rides_out_relay_errors_and_names_the_last_one_when_it_gives_up() -> None:
    s = _Script([RelayError("master restarting"), (None, False), ("done", False)])
    assert SnapshotWait(5, 1, 0.001).until(s.attempt, s.ask, lambda e: AssertionError(e)) == "done"
    down = _Script([RelayError("master down")] * 1000)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="; last relay error: master down"):
        SnapshotWait(0.2, 1, 0.01).until(down.attempt, down.ask, lambda e: TimeoutError(e))
    assert 0.2 <= time.monotonic() - t0 < 2 and not down.asks  # never reached the relay to ask


@pytest.mark.parametrize("bad", [dict(timeout_s=-1), dict(timeout_s=1, rerequest_s=0),
                                 dict(timeout_s=1, poll_s=0)])
def test_rejects_nonsense_settings(bad) -> None:
    with pytest.raises(ValueError, match="timeout_s must be"):
        SnapshotWait(**bad)
