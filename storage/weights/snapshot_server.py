"""Full snapshots on request: the trainer's publisher answers receivers that cannot apply a delta.

The protocol (storage/weights/sparse_publisher.py's docstring): a receiver writes
`rose/<run>/v<v>/full-request` (or `<part>/full-request`); `serve_requests`, polled by a thread
on the trainer (`start_server`), pushes a full snapshot of the held version under `full/`
(`<part>/full/`) and removes the request, pushing again only for a snapshot the request names
as damaged; it also republishes the held version in full when the relay lost its manifest.
`SnapshotServer` is the part of SparsePublisher that does this: it uses the publisher's lock,
held version and `_push`.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING

from storage.relay.base import RelayError, RelayKeyMissing
from storage.weights.versions import full_part, manifest_key, read_manifest, request_key
from storage.weights.transfer_metrics import PublishReport

if TYPE_CHECKING:
    import torch

    from storage.relay.base import Relay

log = logging.getLogger("rose.publish")


class SnapshotServer:
    """Serving full snapshots of the held version; mixed into SparsePublisher."""

    relay: "Relay"
    run: str
    part: str
    version: int | None
    served: list[PublishReport]
    _held: "dict[str, torch.Tensor] | None"
    _lock: threading.RLock
    _stop: threading.Event | None

    def republish_held(self, version: int) -> PublishReport | None:
        """Push `version` again in full under this publisher's prefix, if it is the version held
        (the relay lost it: a master restart); None if another one, or none, is held."""
        with self._lock:
            if self._held is None or self.version != version:
                return None
            where = f"part {self.part} of " if self.part else ""
            log.warning("relay %s lost %sv%d of run %s: republishing it in full",
                        self.relay.name, where, version, self.run)
            report = self._push(version, self._held, None, "relay lost the published version",
                                self.part)
            self.served.append(report)
            return report

    def serve_requests(self, check_lost: bool = True) -> PublishReport | None:
        """One pass: republish the held version if the relay lost it (`check_lost`); answer a
        request for a full snapshot of it. Returns what was pushed, if anything."""
        with self._lock:
            if self._held is None:
                return None
            v = self.version
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
                report = self._push(v, self._held, None, reason.strip(), part=full_part(self.part))
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

    def start_server(self, interval_s: float = 0.1) -> None:
        """Serve requests from a daemon thread until stop_server (idempotent)."""
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

    def stop_server(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
