"""The API served by a real uvicorn on a loopback port, in a thread, for tests that need real
connections (keep-alive, what the server does to a socket after an answer)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from starlette.applications import Starlette

from tests.support.servers import free_port


@contextmanager
def serving(app: Starlette) -> Iterator[int]:
    """Serve `app` (lifespan included) until the block ends; yields the port."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=15)


class KeptAlive:
    """One HTTP/1.1 connection for every request; fails a test if the server ever closes it."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self._headers = headers
        self._socket: Any = None

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send one request; returns the status and the JSON body."""
        data = None if body is None else json.dumps(body).encode()
        headers = {**self._headers, **({"Content-Type": "application/json"} if data else {})}
        self._connection.request(method, path, body=data, headers=headers)
        response = self._connection.getresponse()
        payload = json.loads(response.read() or b"null")
        assert response.getheader("connection", "").lower() != "close", (path, payload)
        if self._socket is None:
            self._socket = self._connection.sock
        assert self._connection.sock is self._socket, f"the connection was dropped at {path}"
        return response.status, payload

    def close(self) -> None:
        self._connection.close()
