"""uvicorn serving the endpoint's app in a daemon thread of the serving worker process, bound to
127.0.0.1 on a port chosen before the thread starts (app.py builds the app and keeps one per
worker)."""
from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI


class ServingEndpoint:
    """uvicorn in a daemon thread, on a socket bound before the thread starts (no port race)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name=f"endpoint-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._sock.close()
                raise RuntimeError(f"serving endpoint on {host}:{self.port} did not start")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()
