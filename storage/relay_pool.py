"""One relay client per process and kind.

A Mooncake object lives in the memory segment of the process that put it: the trainer's
client must outlive the publish call, or the buckets vanish before anyone pulls them.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from storage.relay import Relay, make_relay

_clients: dict[str, Relay] = {}
_lock = threading.Lock()


def resolve_kind(kind: str) -> str:
    """"auto" = the relay the local stack started (ROSE_RELAY), Mooncake unless it fell back."""
    if kind != "auto":
        return kind
    return os.environ.get("ROSE_RELAY", "mooncake")


def shared_relay(kind: str = "auto") -> Relay:
    kind = resolve_kind(kind)
    with _lock:
        if kind not in _clients:
            root = None
            if kind == "filesystem":
                root = Path(os.environ.get("ROSE_RUN_DIR", ".rose/stack")) / "relay"
            _clients[kind] = make_relay(kind, root=root)
        return _clients[kind]
