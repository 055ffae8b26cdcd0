"""Mooncake Store services of the local stack: the HTTP metadata server, the master, and the
store client that holds what is published.

All bind 127.0.0.1 only. The master's built-in metadata server would bind 0.0.0.0 whatever
its host flag says, so it stays off and the separate Python one is used.

The store client (`mooncake_client`, Mooncake's "real client") owns the segment the published
weights live in; every process of this host opens its relay as a "dummy" client of it
(storage/relay/mooncake.py), handing it shared memory: a put or a get is then memory copies
(into or out of that memory, and the store client's to or from its segment) instead of a TCP
transfer between two processes (bench/transfer/relay.py). A reader on another host reaches the same
segment over TCP as before. If it cannot start, the relay works as before it existed (each
publisher's own segment, gets over TCP), and `rose up` says so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from coordination.errors import StackError
from coordination.probes import port_answers
from rose.stack.ports import LOCALHOST, free_port
from rose.stack.process import ManagedProcess, venv_binary

START_TIMEOUT_S = 20.0
MASTER_RESTART_WAIT_S = 20  # a relay op's wait for a master the supervisor restarts


def _binary(name: str) -> str:
    try:
        return venv_binary(name)
    except StackError as e:
        raise StackError(f"{e} (pip install mooncake-transfer-engine-non-cuda)") from None


@dataclass
class MooncakeServices:
    master_addr: str  # "127.0.0.1:Q", the master's RPC address
    metadata_url: str  # "http://127.0.0.1:P/metadata"
    processes: list[ManagedProcess] = field(default_factory=list, repr=False)
    client_addr: str | None = None  # "127.0.0.1:C", the store client's; None: not running
    client_error: str = ""  # why it is not running, when it was asked for

    def alive(self) -> bool:
        host, port = self.master_addr.rsplit(":", 1)
        return all(p.running() for p in self.processes) and port_answers(host, int(port))

    def stop(self) -> None:
        for p in reversed(self.processes):  # master first: it talks to the metadata server
            p.stop(grace=5)


def start_mooncake(run_dir: Path, metadata_port: int | None = None,
                   master_port: int | None = None, store_mb: int = 1024) -> MooncakeServices:
    """Start the metadata server and the master on free loopback ports; wait until both answer.
    Then the store client with a `store_mb` segment (0: none); a client that fails to start
    leaves the other two running, with `client_error` saying why."""
    run_dir = Path(run_dir)
    meta_port = metadata_port or free_port()
    rpc_port = master_port or free_port()
    metrics_port = free_port()
    metadata = ManagedProcess("mooncake-metadata", [
        _binary("mooncake_http_metadata_server"), "--host", LOCALHOST,
        "--port", str(meta_port), "--log-level", "WARNING"], run_dir)
    master = ManagedProcess("mooncake-master", [
        _binary("mooncake_master"),
        f"--rpc_address={LOCALHOST}", f"--rpc_port={rpc_port}",
        "--enable_http_metadata_server=false",
        f"--metrics_host={LOCALHOST}", f"--metrics_port={metrics_port}",
        "--enable_metric_reporting=false"], run_dir)
    started: list[ManagedProcess] = []
    try:
        for proc, port in ((metadata, meta_port), (master, rpc_port)):
            started.append(proc.start())
            proc.wait_for_port(LOCALHOST, port, timeout=START_TIMEOUT_S)
    except StackError:
        for p in reversed(started):
            p.stop(grace=3)
        raise
    services = MooncakeServices(f"{LOCALHOST}:{rpc_port}",
                                f"http://{LOCALHOST}:{meta_port}/metadata", started)
    if store_mb > 0:
        try:
            services.client_addr = _start_store_client(services, run_dir, store_mb)
        except StackError as e:
            services.client_error = str(e)
    return services


def _start_store_client(services: MooncakeServices, run_dir: Path, store_mb: int) -> str:
    """Start `mooncake_client` against the master; its address once it answers."""
    port = free_port()
    client = ManagedProcess("mooncake-store-client", [
        _binary("mooncake_client"), f"--master_server_address={services.master_addr}",
        f"--metadata_server={services.metadata_url}", f"--global_segment_size={store_mb} MB",
        # its own gets (a dummy client's plain get of a small value) land in this buffer
        "--local_buffer_size=64 MB", f"--host={LOCALHOST}", f"--port={port}", "--protocol=tcp",
        "--threads=2"], run_dir, env={"MC_TCP_BIND_ADDRESS": LOCALHOST})
    client.start()
    address = f"{LOCALHOST}:{port}"
    try:
        client.wait_for_port(LOCALHOST, port, timeout=START_TIMEOUT_S)
        _touch_segment(services.master_addr, services.metadata_url, address, store_mb)
    except StackError:
        client.stop(grace=3)
        raise
    services.processes.append(client)
    return address


def _touch_segment(master_addr: str, metadata_url: str, client_addr: str, store_mb: int) -> None:
    """Have the store client fault its segment's pages in once, now: a value put into pages
    never used costs ~7x one put into pages used before (27 vs 4 ms for 64 MB here), and once
    every page was used, whatever the allocator hands out was. Fills it with 64 MB values,
    then removes them (~0.5 s per GB)."""
    from storage.relay.base import RelayError
    from storage.relay.mooncake import MooncakeRelay

    chunk = 64 << 20
    relay = MooncakeRelay(master_addr, metadata_url, segment_bytes=0,
                          local_buffer_bytes=chunk, client_addr=client_addr)
    try:
        filler = bytes(chunk)
        for i in range(max(1, (store_mb << 20) // chunk)):
            try:
                relay.put(f"rose-stack/touch/{i}", filler)
            except RelayError:  # full: what is left is smaller than a chunk
                break
        relay.remove_prefix("rose-stack/touch/")
    except RelayError as e:
        raise StackError(f"the Mooncake store client at {client_addr} does not take values: "
                         f"{e}") from None
    finally:
        relay.close()


def mooncake_env(services: MooncakeServices) -> dict[str, str]:
    """Env for any process that opens a store client (driver and Dask workers)."""
    return {
        "MC_TCP_BIND_ADDRESS": LOCALHOST,  # the transfer engine would listen on all interfaces
        "MC_STORE_CLIENT_SETUP_RETRIES": "1",  # else setup blocks ~90 s when the master is down
        # the stack's supervisor restarts a master that dies (~1-2 s): relay ops wait for it
        "ROSE_MOONCAKE_RESTART_WAIT_S": str(MASTER_RESTART_WAIT_S),
        "ROSE_MOONCAKE_MASTER": services.master_addr,
        "ROSE_MOONCAKE_METADATA": services.metadata_url,
        **({"ROSE_MOONCAKE_CLIENT": services.client_addr} if services.client_addr else {}),
    }


def open_store(master_addr: str | None = None, metadata_url: str | None = None,
               segment_bytes: int = 256 << 20, buffer_bytes: int = 128 << 20):
    """A MooncakeDistributedStore client connected to the master, or a one-line StackError.

    Defaults come from ROSE_MOONCAKE_MASTER / ROSE_MOONCAKE_METADATA (set by mooncake_env).
    The master's port is checked first so a dead master fails at once with its address.
    """
    master_addr = master_addr or os.environ.get("ROSE_MOONCAKE_MASTER")
    metadata_url = metadata_url or os.environ.get("ROSE_MOONCAKE_METADATA")
    if not master_addr or not metadata_url:
        raise StackError("Mooncake master/metadata address unknown "
                         "(set ROSE_MOONCAKE_MASTER and ROSE_MOONCAKE_METADATA, or run `rose up`)")
    host, port = master_addr.rsplit(":", 1)
    if not port_answers(host, int(port), timeout=2.0):
        raise StackError(f"Mooncake master at {master_addr} does not answer (is the stack up?)")
    from storage.relay.base import RelayError
    from storage.relay.mooncake_client import open_store as open_client

    try:  # as the relay opens it: a client of the stack's store client where there is one
        return open_client(master_addr, metadata_url, segment_bytes, buffer_bytes,
                           os.environ.get("ROSE_MOONCAKE_CLIENT") or None)
    except RelayError as e:
        raise StackError(str(e)) from None


def round_trip(nbytes: int = 1 << 20, key_prefix: str = "rose/self-check") -> int:
    """Put and get `nbytes` random bytes through the store with this process's env; returns the
    byte count. A health check for any process of the stack (driver or worker)."""
    store = open_store(segment_bytes=max(32 << 20, 4 * nbytes), buffer_bytes=max(32 << 20, 2 * nbytes))
    payload = os.urandom(nbytes)
    key = f"{key_prefix}/{os.getpid()}/{payload[:8].hex()}"
    if store.put(key, payload) != 0:
        raise StackError(f"Mooncake put of {nbytes} bytes failed")
    back = store.get(key)
    store.remove(key)
    if back != payload:
        raise StackError(f"Mooncake get returned {len(back)} bytes, not the {nbytes} put")
    return len(back)
