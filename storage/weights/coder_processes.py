"""Coder processes: a delta's pieces coded in processes of their own, each with its own GIL.

Threads code a delta's tensors in parallel (storage/weights/parallel.py), but the Python around
the kernels (the time model's judge, headers, the chooser) holds the GIL: ~0.25 ms per coded
piece, 70-100 ms per 0.5B publish on this project's VM, which on a host of 8 cores and more is
the publish's floor (bench/transfer/transfer_gil.py). Here the publisher hands a publish's pieces to
coder processes at its start, as one table per coder and a queue of piece numbers they take
from in order (a pipe: each takes the next one when free), and its encoding threads only wait
for the results in the order the buckets need them. A coder maps the version's arena and its
base's (storage/weights/tensor_arena.py) and runs the same `code_piece` the threads do
(storage/weights/piece_coder.py): a piece comes out byte for byte the same either way.

Started as plain subprocesses (a Dask worker is a daemonic process, which multiprocessing may
not give children; fork would copy a trainer's page tables per publish), connected over a
Unix socket with an auth key; each exits when the publisher's end closes (its process gone).
"""
from __future__ import annotations

import logging
import os
import secrets
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from storage.delta import time_model
from storage.weights.piece_coder import CodedPiece
from storage.weights.tensor_arena import Slot

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
ANSWER_TIMEOUT_S = 60.0  # no piece takes a coder this long: it is stuck
END = 0xFFFFFFFF  # in the queue: no more pieces in this publish (one per coder)
PIPE_NUMBERS = 16_000  # the queue's pipe holds this many numbers without blocking (64 KB)
_ROOT = Path(__file__).resolve().parents[2]
Job = tuple[str, tuple[str, Slot], tuple[str, Slot], "tuple[int, int] | None"]


class CoderError(RuntimeError):
    """A coder process failed a piece, or is gone."""


class Batch:
    """One publish's pieces in the coders. Whoever waits for a piece reads the coders' answers
    (no reader threads: a hand-off between threads costs more GIL than the read itself)."""

    def __init__(self, coders: "CoderProcesses") -> None:
        self._coders = coders
        self.results: dict[int, CodedPiece | CoderError] = {}
        self.coding = coders.count  # coders not yet done with this publish's queue
        self._lock = threading.Lock()

    def result(self, index: int) -> CodedPiece:
        """Piece `index` once coded (CoderError: its coder failed it, or the coders are gone)."""
        with self._lock:
            while index not in self.results:
                if not self._coders._receive(self):
                    raise CoderError(self._coders.failed)
            result = self.results.pop(index)
        if isinstance(result, CoderError):
            raise result
        return result

    def finish(self) -> None:
        """Read on until every coder is done with this publish's queue (or they failed)."""
        with self._lock:
            while self.coding > 0 and self._coders._receive(self):
                pass


class HandedOut:
    """The pieces of one publish handed to the coders: `get` waits for one (None: not handed
    out, or its coder failed: the caller codes it itself)."""

    def __init__(self, batch: Batch | None, index: dict[tuple[str, tuple[int, int] | None], int]):
        self._batch, self._index = batch, index

    def __bool__(self) -> bool:
        """Whether any piece was handed out (the rest are cheap: they need no threads)."""
        return self._batch is not None

    def get(self, name: str, span: tuple[int, int] | None) -> CodedPiece | None:
        i = self._index.get((name, None if span is None else tuple(span)))
        if i is None:
            return None
        try:
            return self._batch.result(i)
        except CoderError:
            return None  # coded again by the caller, which then says what failed, if it does


class CoderProcesses:
    """`count` coder processes, started in the background (`ready` once all have connected)."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"coder processes: need at least 1, got {count}")
        self.count = count
        self._dir = tempfile.mkdtemp(prefix="rose-coders-")
        key = secrets.token_bytes(16)
        self._listener = Listener(os.path.join(self._dir, "socket"), "AF_UNIX", authkey=key)
        jobs, self._jobs = os.pipe()  # the coders read piece numbers from it, in turn
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")])}
        self._procs = [subprocess.Popen(
            [sys.executable, "-m", "storage.weights.coder_child", self._listener.address,
             key.hex(), str(jobs)], env=env, stdin=subprocess.DEVNULL, pass_fds=(jobs,))
            for _ in range(count)]
        os.close(jobs)
        self._conns: list[Connection] = []
        self._send = threading.Lock()  # one publish's batch at a time, its messages in order
        self._batch: Batch | None = None
        self._ready = threading.Event()
        self.failed: str | None = None  # why they are not used (then the threads code)
        threading.Thread(target=self._accept, name="rose-coders-accept", daemon=True).start()

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def _accept(self) -> None:
        try:
            for _ in range(self.count):
                conn = self._listener.accept()
                if conn.recv() != ("ready",):
                    raise CoderError("a coder process did not start")
                self._conns.append(conn)
        except Exception as exc:  # noqa: BLE001 - said once, loudly; the threads code instead
            self._fail(f"coder processes did not start: {type(exc).__name__}: {exc}")
        finally:
            self._listener.close()  # (and its socket file)
            try:
                os.rmdir(self._dir)
            except OSError:
                pass
            self._ready.set()

    def cpu_s(self) -> float:
        """CPU seconds the coders have used so far (those still running)."""
        total = 0.0
        for pid in self.pids:
            try:
                times = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def ready(self, timeout: float | None = 0.0) -> bool:
        """Whether every coder is connected and none has failed (waits up to `timeout`)."""
        self._ready.wait(timeout)
        return self._ready.is_set() and self.failed is None

    def start(self, jobs: list[Job], link: time_model.Link | None, base_version: int | None,
              target_version: int) -> Batch:
        """Hand a publish's pieces to the coders, each job (name, (new arena, slot), (base
        arena, slot), span or None); they code them in this order as each becomes free."""
        with self._send:
            if self._batch is not None:  # the last publish's coders are done with its queue
                self._batch.finish()
            if self.failed:
                raise CoderError(self.failed)
            batch = self._batch = Batch(self)
            try:
                for conn in self._conns:
                    conn.send(("publish", jobs, link, base_version, target_version))
                queue = struct.pack(f"<{len(jobs) + self.count}I", *range(len(jobs)),
                                    *[END] * self.count)
                if len(jobs) + self.count <= PIPE_NUMBERS:
                    self._queue(queue)
                else:  # more than the pipe holds: written while the answers are read
                    threading.Thread(target=self._queue, args=(queue, True), daemon=True,
                                     name="rose-coders-queue").start()
            except OSError as exc:
                self._fail(f"a coder process is gone ({type(exc).__name__})")
                raise CoderError(self.failed) from exc
            return batch

    def _queue(self, numbers: bytes, background: bool = False) -> None:
        """Write piece numbers into the queue (blocks while it is full and the coders busy)."""
        view = memoryview(numbers)
        try:
            while view:
                view = view[os.write(self._jobs, view):]
        except OSError as exc:
            if not background:
                raise
            self._fail(f"a coder process is gone ({type(exc).__name__})")

    def hand_out(self, work: list[tuple[str, "torch.Tensor", tuple[int, int] | None]],
                 new: tuple[str, dict[str, Slot]], base: tuple[str, dict[str, Slot]],
                 link: time_model.Link | None, base_version: int | None, target_version: int,
                 skip: Callable[["torch.Tensor", tuple[int, int] | None], bool]) -> HandedOut:
        """Start coding `work` (pieces in the order they go out: name, tensor, span) that
        have a slot in both arenas, `new` and `base` each (path, slots), and are not `skip`ped
        (raw on their sizes alone: not worth the hand-off)."""
        new_path, new_slots = new
        base_path, base_slots = base
        jobs: list[Job] = []
        index: dict[tuple[str, tuple[int, int] | None], int] = {}
        for name, tensor, span in work:
            if name in new_slots and name in base_slots and not skip(tensor, span):
                index[name, None if span is None else tuple(span)] = len(jobs)
                jobs.append((name, (new_path, new_slots[name]), (base_path, base_slots[name]),
                             None if span is None else tuple(span)))
        return HandedOut(self.start(jobs, link, base_version, target_version) if jobs else None,
                         index)

    def _receive(self, batch: Batch) -> bool:
        """Read what the coders have answered into `batch` (waiting for one answer at most
        ANSWER_TIMEOUT_S); False once they failed."""
        if self.failed:
            return False
        try:
            ready = wait(self._conns, ANSWER_TIMEOUT_S)
            if not ready:
                self._fail(f"no coder process answered in {ANSWER_TIMEOUT_S:.0f} s")
            for conn in ready:
                message = conn.recv()
                if message[0] == "done":
                    batch.coding -= 1
                elif message[0] == "error":
                    batch.results[message[1]] = CoderError(message[2])
                else:
                    _, index, encoding, checksum, changed, seconds, has_payload = message
                    payload = conn.recv_bytes() if has_payload else None
                    batch.results[index] = CodedPiece(payload, encoding, checksum, changed,
                                                      seconds)
        except (EOFError, OSError) as exc:
            self._fail(f"a coder process is gone ({type(exc).__name__})")
        return self.failed is None

    def _fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why
            log.warning("%s; the publisher codes on its own threads", why)

    def close(self) -> None:
        """Stop the coders (each exits when its connection closes) and wait for them."""
        self.failed = self.failed or "coder processes closed"  # asked for: nothing to warn of
        for conn in self._conns:
            conn.close()
        os.close(self._jobs)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


_shared: dict[int, CoderProcesses] = {}
_lock = threading.Lock()


def shared_coders(count: int) -> CoderProcesses:
    """This process's `count` coder processes, started at the first call (publishers share
    them: a sharded publisher's parts, a run's publisher made anew); started again if they
    failed."""
    with _lock:
        coders = _shared.get(count)
        if coders is None or (coders.failed and coders._ready.is_set()):
            if coders is not None:
                coders.close()  # what is left of them
            coders = _shared[count] = CoderProcesses(count)
        return coders
