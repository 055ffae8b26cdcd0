"""Relays by kind (`make_relay`), and one shared relay client per process and kind.

A Mooncake object lives in the memory segment of the process that put it: the trainer's
client must outlive the publish call, or the buckets vanish before anyone pulls them. Where
the stack runs a store client (ROSE_MOONCAKE_CLIENT, rose/stack/mooncake.py), every client of
this host is a dummy client of it instead, and objects live in its segment.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from storage.relay.base import Relay, RelayError
from storage.relay.filesystem import FilesystemRelay

log = logging.getLogger("rose.relay")
_clients: dict[tuple[str, str], Relay] = {}
_lock = threading.Lock()


def make_relay(kind: str, root: Path | str | None = None, master_addr: str | None = None,
               metadata_url: str | None = None, segment_bytes: int | None = None,
               local_buffer_bytes: int | None = None, client_addr: str | None = None) -> Relay:
    """A relay by kind: "filesystem" (needs root) or "mooncake" (addresses default to
    ROSE_MOONCAKE_MASTER / ROSE_MOONCAKE_METADATA; the store client to be a dummy client of,
    to ROSE_MOONCAKE_CLIENT with the master from there, when the stack runs one)."""
    if kind == "filesystem":
        if root is None:
            raise ValueError("the filesystem relay needs a root directory")
        return FilesystemRelay(root)
    if kind == "mooncake":
        from storage.relay.mooncake import MooncakeRelay  # imports the native client lazily

        if master_addr is None and client_addr is None:  # the stack's, as the env says
            client_addr = os.environ.get("ROSE_MOONCAKE_CLIENT") or None
        master_addr = master_addr or os.environ.get("ROSE_MOONCAKE_MASTER")
        metadata_url = metadata_url or os.environ.get("ROSE_MOONCAKE_METADATA")
        if not master_addr or not metadata_url:
            raise RelayError("mooncake relay: master/metadata address unknown (pass them or set "
                             "ROSE_MOONCAKE_MASTER and ROSE_MOONCAKE_METADATA; `rose up` does)")
        sizes = {k: v for k, v in (("segment_bytes", segment_bytes),
                                   ("local_buffer_bytes", local_buffer_bytes)) if v is not None}
        return MooncakeRelay(master_addr, metadata_url, **sizes, client_addr=client_addr)
    raise ValueError(f"unknown relay kind {kind!r} (expected 'mooncake' or 'filesystem')")


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
        if kind == "mooncake" and os.environ.get("ROSE_MOONCAKE_CLIENT"):
            relay = _store_client_relay()
            if relay is not None:
                return relay
        if (kind, role) not in _clients:
            root, sizes = None, {}
            if kind == "filesystem":
                root = Path(os.environ.get("ROSE_RUN_DIR", ".rose/stack")) / "relay"
            elif role == "reader":
                sizes["segment_bytes"] = 0
            _clients[kind, role] = make_relay(kind, root=root, **sizes)
        return _clients[kind, role]


def _store_client_relay() -> Relay | None:
    """This process's one client of the stack's store client (under _lock): it has no segment
    to contribute, so it serves both roles (Mooncake 0.3.13 cannot reconnect two of them in one
    process after a master restart). None if it cannot be one: then this process's clients
    are TCP clients by role, said loudly."""
    if ("mooncake", "store-client") not in _clients:
        try:
            _clients["mooncake", "store-client"] = make_relay("mooncake")
        except RelayError as e:
            log.error("cannot be a client of the store client at %s (%s): this process's relay "
                      "clients go over TCP, a publisher's values in its own segment",
                      os.environ.pop("ROSE_MOONCAKE_CLIENT"), e)
            return None
    return _clients["mooncake", "store-client"]
