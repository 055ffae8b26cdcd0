"""Setting up a Mooncake Store client, and telling whether the peers it needs answer.

`open_store` is the one place a client is set up (the relay, storage/relay/mooncake.py, and
the stack's health check): against the master over TCP on loopback, or as a dummy client of
the stack's store client. `answers` (a TCP connect, ~0.1 ms on loopback) tells a peer that is
gone from one that is slow, which Mooncake's own RPCs tell only after a ~4 s timeout.
"""
from __future__ import annotations

import os
import socket
import time

from storage.relay.base import RelayError

SETUP_WAIT_S = 2.0  # a dummy client answers health checks some ms after its setup


def open_store(master_addr: str, metadata_url: str, segment_bytes: int, local_buffer_bytes: int,
               client_addr: str | None = None):
    """A MooncakeDistributedStore client set up against the master over TCP on loopback, or as
    a dummy client of the store client at `client_addr`."""
    # Before setup: bind the transfer engine to loopback, and fail setup fast (else ~90 s).
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    os.environ["MC_STORE_CLIENT_SETUP_RETRIES"] = "1"
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:  # typically the Debian package libibverbs1 is missing
        raise RelayError(f"mooncake relay: cannot import mooncake.store ({e})") from None
    store = MooncakeDistributedStore()
    if client_addr:  # its segment holds the objects; ours is shared memory it maps
        rc = store.setup_dummy(local_buffer_bytes, local_buffer_bytes, client_addr)
        where = f"the store client at {client_addr}"
    else:
        rc = store.setup("127.0.0.1", metadata_url, segment_bytes, local_buffer_bytes, "tcp", "",
                         master_addr)
        where = f"master {master_addr} (metadata {metadata_url})"
    if rc != 0 or not reconnected(store, SETUP_WAIT_S if client_addr else 0.0):
        raise RelayError(f"mooncake relay: client setup against {where} failed: "
                         f"{f'code {rc}' if rc else 'no answer to its health checks'}")
    return store


def answers(address: str) -> bool:
    """Whether something accepts TCP connections at `address` ("host:port")."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2.0).close()
        return True
    except (OSError, ValueError):
        return False


def reconnected(store, within_s: float) -> bool:
    """Whether a client answers health checks, now or within `within_s`: a dummy client does some
    ms after its setup, and ~2-4 s after a master restart, once the store client has reconnected
    (Mooncake 0.3.13)."""
    deadline = time.monotonic() + within_s
    while store.health_check() != 0:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
    return True
