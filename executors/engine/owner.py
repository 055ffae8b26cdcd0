"""One thread that owns in-process engines: an inbox, calls run between steps, a loop.

vLLM engines are not thread-safe, and vLLM's CPU backend binds its OpenMP threads for the
thread that builds an engine, so the owner thread builds, profiles and steps every engine it
holds. Subclasses implement `_open` (build; runs on the owner thread, errors re-raised to the
constructor's caller), `_iterate(inbox)` (one loop turn), `_idle_wait()` (seconds to sleep
when idle), `_on_failure(exc)` (answer everything in flight) and `_shutdown`.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Callable

log = logging.getLogger(__name__)


def futures_of(item: tuple) -> list[Future]:
    """The futures an inbox item carries: bare, or as a submission's `future`."""
    found = (getattr(x, "future", x) for x in item[1:])
    return [f for f in found if isinstance(f, Future)]


class EngineOwner:
    _busy = False  # set by _iterate: more work is ready, do not sleep
    failure_limit = 3  # consecutive failed iterations before everything in flight is failed

    def _start(self, name: str) -> None:
        self._inbox: list[tuple] = []
        self._cv = threading.Condition()
        self._running = True
        self._failures = 0
        self.loop_errors = 0
        ready: Future = Future()
        self._thread = threading.Thread(target=self._main, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.result()

    def close(self) -> None:
        with self._cv:
            self._running = False
            self._cv.notify()
        self._thread.join(timeout=30)

    def _post(self, item: tuple) -> None:
        with self._cv:
            self._inbox.append(item)
            self._cv.notify()

    def _call(self, fn: Callable[[], object]) -> object:
        """Run fn on the owner thread between engine steps and return its result."""
        if threading.current_thread() is self._thread:
            return fn()
        fut: Future = Future()
        with self._cv:
            if not self._running:
                raise RuntimeError(f"{self._thread.name} is closed")
            self._inbox.append(("call", fn, fut))
            self._cv.notify()
        return fut.result()

    def _drain(self) -> list[tuple]:
        """Take what was posted since the iteration began (e.g. arrivals during a step)."""
        with self._cv:
            inbox, self._inbox = self._inbox, []
        return inbox

    @staticmethod
    def _run_call(item: tuple) -> None:
        try:
            item[2].set_result(item[1]())
        except BaseException as exc:  # surfaced to the caller, never kills the loop
            item[2].set_exception(exc)

    def _main(self, ready: Future) -> None:
        try:
            self._open()
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while True:
            with self._cv:
                if self._running and not self._inbox and not self._busy:
                    self._cv.wait(timeout=self._idle_wait())
                if not self._running:
                    break
                inbox, self._inbox = self._inbox, []
            try:
                self._iterate(inbox)
                self._failures = 0
            except Exception as exc:  # keep the loop alive; log, count, never hang a caller
                log.exception("%s: loop iteration failed", self._thread.name)
                self.loop_errors += 1
                self._failures += 1
                if self._failures >= self.failure_limit:  # not a blip
                    self._on_failure(exc)
        try:
            self._shutdown()
        finally:
            for item in self._inbox:  # posted after close: answer, never hang a caller
                for fut in futures_of(item):
                    if not fut.done():
                        fut.set_exception(RuntimeError(f"{self._thread.name} is closed"))

    # ---- for subclasses ----
    def _open(self) -> None:
        raise NotImplementedError

    def _iterate(self, inbox: list[tuple]) -> None:
        raise NotImplementedError

    def _idle_wait(self) -> float:
        return 0.25

    def _on_failure(self, exc: Exception) -> None:
        pass

    def _shutdown(self) -> None:
        pass
