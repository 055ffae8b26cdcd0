"""Ports on the loopback interface: find free ones, refuse busy ones with a clear message."""
from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

from coordination.errors import PortBusyError

LOCALHOST = "127.0.0.1"


_handed_out: set[int] = set()  # a server may bind seconds later: never hand a port out twice
_EPHEMERAL_FALLBACK = (32768, 60999)  # Linux's default ip_local_port_range
# below: ports other software expects to own; Mooncake's transfer engine listens on random
# ports in 15000-17000 as its clients start (a relay client in a worker, seconds after ours)
_LOWEST = 20_000


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel picks from when a process binds port 0 (first, last)."""
    try:
        first, last = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return first, last
    except (OSError, ValueError):  # not Linux, or unreadable: the usual default
        return _EPHEMERAL_FALLBACK


def free_port(host: str = LOCALHOST) -> int:
    """A port nobody listens on right now, from OUTSIDE the kernel's ephemeral range. A
    server started with it binds seconds later (Prefect's takes ~10 s), and meanwhile every
    process that binds port 0 (Dask workers, nannies, transfer engines) draws from the
    ephemeral range: a port the kernel handed out could be handed to one of them first (a
    Dask worker once took the Prefect server's, and `rose up` asked it for /api/health).
    Mooncake's clients pick theirs from a range of their own, below the ports used here."""
    first, last = ephemeral_ports()
    ranges = [r for r in ((_LOWEST, first - 1), (last + 1, 65535)) if r[1] - r[0] >= 1000]
    if not ranges:  # the whole space is ephemeral: the kernel's pick, with its race
        return _kernel_pick(host)
    rng = random.SystemRandom()
    for _ in range(1000):
        low, high = rng.choice(ranges)
        port = rng.randint(low, high)
        if port not in _handed_out and _bind_error(host, port) is None:
            _handed_out.add(port)
            return port
    return _kernel_pick(host)


def _kernel_pick(host: str) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def _bind_error(host: str, port: int) -> OSError | None:
    """Why a listener could not bind host:port now, or None. SO_REUSEADDR: only a live
    listener makes a port busy, not TIME_WAIT leftovers, which is what the servers we start
    (uvicorn, tornado) also ignore."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def ensure_free(port: int, host: str = LOCALHOST) -> int:
    """Return `port` if it can be bound, else raise PortBusyError naming it."""
    if not 0 < port < 65536:
        raise PortBusyError(f"port {port} is not a valid TCP port")
    e = _bind_error(host, port)
    if e is not None:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            raise PortBusyError(f"port {port} on {host} is busy") from None
        raise PortBusyError(f"port {port} on {host} cannot be bound: {e.strerror}") from None
    return port


def pick_port(requested: int | None = None, host: str = LOCALHOST) -> int:
    """The requested port if free (error if busy), else a free one."""
    return ensure_free(requested, host) if requested else free_port(host)


