"""Faults injected from outside the product, as an operator's `kill -9` would: the test watches
the Dask scheduler and SIGKILLs a worker process (and its nanny) by pid while it has rollout
turns in flight. Nothing in the product knows about it."""
from __future__ import annotations

import os
import signal
import threading
import time

from distributed import Client


class KillMidRollout(threading.Thread):
    """SIGKILL worker `victim` (nanny first when `with_nanny`: the GPU is gone for good) once it
    has finished `after_batches` turn batches and is running another one."""

    def __init__(self, scheduler: str, victim: str, after_batches: int = 2,
                 with_nanny: bool = True, timeout_s: float = 600.0) -> None:
        super().__init__(name=f"kill-{victim}", daemon=True)
        self.scheduler, self.victim, self.after = scheduler, victim, after_batches
        self.with_nanny, self.timeout_s = with_nanny, timeout_s
        self.killed: dict = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.scheduler, timeout=30) as client:
                self._watch(client)
        except BaseException as e:  # noqa: BLE001 - reported to the test by result()
            self.error = e

    def _watch(self, client: Client) -> None:
        address = next(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                       if w["name"] == self.victim)
        # the pids first: two round trips between seeing a batch run and the kill gave it time
        # to finish on a busy machine (once the last batch of a step: no step saw the death)
        pid = client.run(os.getpid, workers=[address])[address]
        nanny = client.run(os.getppid, workers=[address])[address] if self.with_nanny else None
        seen: set[str] = set()
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            running = {k for k in client.processing(workers=[address]).get(address, ())
                       if "generate_turns" in str(k)}
            if running and len(seen - running) >= self.after:
                self.killed = {"worker": self.victim, "pid": pid, "nanny_pid": nanny,
                               "at": time.time(), "batches_done": len(seen - running)}
                for target in (nanny, pid):  # nanny first: it cannot restart what dies after it
                    if target:
                        os.kill(target, signal.SIGKILL)
                return
            seen |= running
            time.sleep(0.02)
        raise TimeoutError(f"{self.victim} never ran a turn batch after {self.after} others")

    def result(self, timeout_s: float = 60.0) -> dict:
        self.join(timeout_s)
        if self.error is not None:
            raise self.error
        return self.killed
