"""Ports on the loopback interface: find free ones, refuse busy ones with a clear message."""
from __future__ import annotations

import errno
import socket

from rose.stack.errors import PortBusyError

LOCALHOST = "127.0.0.1"


_handed_out: set[int] = set()  # a server may bind seconds later: never hand a port out twice


def free_port(host: str = LOCALHOST) -> int:
    """A port nobody listens on right now (the kernel's pick; tiny race until the server binds)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def ensure_free(port: int, host: str = LOCALHOST) -> int:
    """Return `port` if it can be bound, else raise PortBusyError naming it."""
    if not 0 < port < 65536:
        raise PortBusyError(f"port {port} is not a valid TCP port")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: only a live listener makes the port busy, not TIME_WAIT leftovers,
        # which is what the servers we start (uvicorn, tornado) also ignore.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortBusyError(f"port {port} on {host} is busy") from None
            raise PortBusyError(f"port {port} on {host} cannot be bound: {e.strerror}") from None
    return port


def pick_port(requested: int | None = None, host: str = LOCALHOST) -> int:
    """The requested port if free (error if busy), else a free one."""
    return ensure_free(requested, host) if requested else free_port(host)


def port_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
