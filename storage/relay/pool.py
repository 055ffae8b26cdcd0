"""One relay client per process and kind.

A Mooncake object lives in the memory segment of the process that put it: the trainer's
client must outlive the publish call, or the buckets vanish before anyone pulls them.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from storage.relay.base import Relay, make_relay

_clients: dict[tuple[str, str], Relay] = {}
_lock = threading.Lock()


def resolve_kind(kind: str) -> str:
    """"auto" = the relay the local stack started (ROSE_RELAY), Mooncake unless it fell back."""
    if kind != "auto":
        return kind
    return os.environ.get("ROSE_RELAY", "mooncake")


def shared_relay(kind: str = "auto", role: str = "publisher") -> Relay:
    """role "publisher" contributes a memory segment (objects live there); "reader" none."""
    if role not in ("publisher", "reader"):
        raise ValueError(f"relay role must be 'publisher' or 'reader', got {role!r}")
    kind = resolve_kind(kind)
    with _lock:
        if (kind, role) not in _clients:
            root, sizes = None, {}
            if kind == "filesystem":
                root = Path(os.environ.get("ROSE_RUN_DIR", ".rose/stack")) / "relay"
            elif role == "reader":
                sizes["segment_bytes"] = 0
            _clients[kind, role] = make_relay(kind, root=root, **sizes)
        return _clients[kind, role]
