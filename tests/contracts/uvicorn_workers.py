"""What the uvicorn contract tests hand to uvicorn: a config subclass, a protocol subclass
and two apps. Worker processes are spawned and import these by name, as they import
groupbuy.api.server's classes in production."""

from __future__ import annotations

from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class MarkedConfig(uvicorn.Config):
    """A Config carrying one attribute of ours to the protocol, as ServerConfig carries
    the head limits."""

    def __init__(self, app: Any, marker: str, **options: Any) -> None:
        super().__init__(app, http=MarkedProtocol, **options)
        self.marker = marker


class MarkedProtocol(HttpToolsProtocol):
    """Answers every request itself with its config's marker, before the app is called
    (as GuardedHttpToolsProtocol answers a refused head)."""

    def on_headers_complete(self) -> None:
        marker = str(getattr(self.config, "marker", "no marker")).encode()
        head = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
        self.transport.write(head % len(marker) + marker)
        self.transport.close()


class LifespanApp:
    """An ASGI app whose lifespan starts (or refuses to, with `fail`); an HTTP request is
    answered `started` once the lifespan has started."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.started = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    if self.fail:
                        await send({"type": "lifespan.startup.failed", "message": "refused"})
                        return
                    self.started = True
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b"started" if self.started else b"not started"
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


serving = LifespanApp()
failing = LifespanApp(fail=True)
