"""A tiny in-process event bus: flows say what phase they are in; a live view may listen.

No listener = no cost, so flows run the same from the CLI, the Prefect UI or tests.
"""
from __future__ import annotations

from typing import Callable

_listeners: list[Callable[[str, dict], None]] = []


def subscribe(listener: Callable[[str, dict], None]) -> Callable[[], None]:
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


def emit(event: str, **data) -> None:
    for listener in list(_listeners):
        listener(event, data)
