"""Mooncake Store services of the local stack: the HTTP metadata server and the master.

Both bind 127.0.0.1 only. The master's built-in metadata server would bind 0.0.0.0 whatever
its host flag says, so it stays off and the separate Python one is used.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rose.stack.errors import StackError
from rose.stack.ports import LOCALHOST, free_port, port_answers
from rose.stack.process import ManagedProcess, venv_binary

START_TIMEOUT_S = 20.0


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

    def alive(self) -> bool:
        host, port = self.master_addr.rsplit(":", 1)
        return all(p.running() for p in self.processes) and port_answers(host, int(port))

    def stop(self) -> None:
        for p in reversed(self.processes):  # master first: it talks to the metadata server
            p.stop(grace=5)


def start_mooncake(run_dir: Path, metadata_port: int | None = None,
                   master_port: int | None = None) -> MooncakeServices:
    """Start the metadata server and the master on free loopback ports; wait until both answer."""
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
    return MooncakeServices(f"{LOCALHOST}:{rpc_port}",
                            f"http://{LOCALHOST}:{meta_port}/metadata", started)


def mooncake_env(services: MooncakeServices) -> dict[str, str]:
    """Env for any process that opens a store client (driver and Dask workers)."""
    return {
        "MC_TCP_BIND_ADDRESS": LOCALHOST,  # the transfer engine would listen on all interfaces
        "MC_STORE_CLIENT_SETUP_RETRIES": "1",  # else setup blocks ~90 s when the master is down
        "ROSE_MOONCAKE_MASTER": services.master_addr,
        "ROSE_MOONCAKE_METADATA": services.metadata_url,
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
    from storage.relay.mooncake import open_store as open_client

    try:
        return open_client(master_addr, metadata_url, segment_bytes, buffer_bytes)
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
