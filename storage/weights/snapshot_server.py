"""Full snapshots on request: the trainer's publisher answers receivers that cannot apply a delta.

Receivers that cannot apply a delta (no base, another base, a damaged or lost bucket, a relay
that lost its objects) ask for a full snapshot; the design chosen here is republish on request:
  - the receiver writes `rose/<run>/v<v>/full-request` (versions.request_key);
  - `serve_requests` (polled by a thread on the trainer, `start`) pushes a full snapshot
    of the held version under `rose/<run>/v<v>/full/` and removes the request. It pushes again
    only if the request names the snapshot there as damaged (by its published_at stamp);
  - it also checks that the held version's manifest is still in the relay; if the relay lost it
    (Mooncake master restart, eviction) it republishes that version in full, under its own key.
Only the held (newest) version can be served: a receiver further behind takes the newest.
No full snapshot is pushed unless someone needs it, so steady-state pushes stay sparse.
A publisher of one `part` of a version (storage/weights/sharded_publisher.py) serves the same protocol
under the part's prefix: `<part>/full-request`, answered under `<part>/full/`; it never
republishes a lost part on its own (its version's commit names the stamp it had).

A SnapshotServer belongs to one storage.weights.sparse_publisher.SparsePublisher and sees it
through what it is given: the publisher's lock (held while it publishes), its held version,
and a full push of that version.
"""
from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from storage.relay.base import RelayError, RelayKeyMissing
from storage.weights.versions import full_part, manifest_key, read_manifest, request_key
from storage.weights.transfer_metrics import PublishReport

if TYPE_CHECKING:
    import torch

    from storage.relay.base import Relay

    Tensors = dict[str, torch.Tensor]

log = logging.getLogger("rose.publish")


class SnapshotServer:
    """Serving full snapshots of one publisher's held version, under its `part` of each."""

    def __init__(self, relay: "Relay", run: str, part: str, lock: threading.RLock,
                 held: "Callable[[], tuple[int | None, Tensors | None]]",
                 push_full: "Callable[[int, Tensors, str, str], PublishReport]") -> None:
        """`held()`: the publisher's version and its tensors (None before its first publish),
        read under `lock`; `push_full(version, tensors, reason, part)`: push them in full
        under that part of the version, as a PublishReport."""
        self.relay, self.run, self.part = relay, run, part
        self._lock, self._held, self._push_full = lock, held, push_full
        self._stop: threading.Event | None = None
        self.served: list[PublishReport] = []  # full snapshots pushed

    def republish_held(self, version: int) -> PublishReport | None:
        """Push `version` again in full under this publisher's prefix, if it is the version held
        (the relay lost it: a master restart); None if another one, or none, is held."""
        with self._lock:
            held_version, tensors = self._held()
            if tensors is None or held_version != version:
                return None
            where = f"part {self.part} of " if self.part else ""
            log.warning("relay %s lost %sv%d of run %s: republishing it in full",
                        self.relay.name, where, version, self.run)
            report = self._push_full(version, tensors, "relay lost the published version",
                                     self.part)
            self.served.append(report)
            return report

    def serve_requests(self, check_lost: bool = True) -> PublishReport | None:
        """One pass: republish the held version if the relay lost it (`check_lost`); answer a
        request for a full snapshot of it. Returns what was pushed, if anything."""
        with self._lock:
            v, tensors = self._held()
            if tensors is None:
                return None
            if check_lost and not self.part and not self.relay.exists(manifest_key(self.run, v)):
                return self.republish_held(v)
            key = request_key(self.run, v, self.part)
            if not self.relay.exists(key):  # cheaper than a missing get
                return None
            try:
                request = json.loads(self.relay.get(key))
            except RelayKeyMissing:
                return None
            except ValueError:  # a torn or foreign value: treat as a plain request
                request = {}
            report = None
            damaged = request.get("damaged")
            stamp = self._full_snapshot_stamp(v)
            # Push unless a snapshot is there that the requester did not find damaged (it may
            # have asked before that one landed): repeated requests cost no repeated pushes.
            if stamp is None or (isinstance(damaged, list) and stamp in damaged):
                reason = f"requested by {request.get('by', '?')}: {request.get('reason', '')}"
                report = self._push_full(v, tensors, reason.strip(), full_part(self.part))
                self.served.append(report)
            self.relay.remove(key)
            return report

    def _full_snapshot_stamp(self, version: int) -> float | None:
        """published_at of the full snapshot of `version` in the relay; None if absent or
        unreadable (then it is pushed again)."""
        try:
            return read_manifest(self.relay, self.run, version, full_part(self.part)).meta.get("published_at")
        except (RelayKeyMissing, ValueError):
            return None

    def start(self, interval_s: float = 0.1) -> None:
        """Serve requests from a daemon thread until stop (idempotent)."""
        if self._stop is not None:
            return
        self._stop = stop = threading.Event()

        def loop() -> None:
            backoff, passes = interval_s, 0
            while not stop.wait(backoff):
                try:  # a lost version is rarer than a request: look for it about once a second
                    self.serve_requests(check_lost=passes % max(1, round(1 / interval_s)) == 0)
                    backoff, passes = interval_s, passes + 1
                except (RelayError, OSError) as e:  # relay down (master restarting): retry
                    log.warning("full-snapshot server of run %s: %s", self.run, e)
                    backoff = min(2.0, backoff * 2)
                except Exception:  # never let the thread die silently
                    log.exception("full-snapshot server of run %s failed a pass", self.run)
                    backoff = min(2.0, backoff * 2)

        threading.Thread(target=loop, name=f"rose-snapshots-{self.run}", daemon=True).start()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
