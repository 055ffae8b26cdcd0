"""Whether a service answers: a TCP connect, an HTTP GET (never through a proxy)."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True when a GET on `url` answers 2xx."""
    try:
        with _NO_PROXY.open(url, timeout=timeout) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def port_answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
