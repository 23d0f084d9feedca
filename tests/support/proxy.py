"""A loopback TCP proxy in front of Redis that can cut or stall connections on demand."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlparse


@dataclass
class FaultyProxy:
    """Forwards bytes both ways; `cut_after(n)` drops the next connection once n reply bytes
    passed, `stall()` stops forwarding replies (`stall(False)` lets new replies through, while
    a reply already held stays held until its connection closes), `refuse()` closes every new
    connection."""

    upstream_host: str
    upstream_port: int
    port: int = 0
    connections: int = 0
    _cut_after: int | None = None
    _stalled: asyncio.Event = field(default_factory=asyncio.Event)
    _refusing: bool = False
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cut_after(self, reply_bytes: int) -> None:
        self._cut_after = reply_bytes

    def stall(self, stalled: bool = True) -> None:
        if stalled:
            self._stalled.set()
        else:
            self._stalled.clear()

    def refuse(self, refusing: bool = True) -> None:
        self._refusing = refusing

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._refusing:
            client_w.close()
            return
        self.connections += 1
        server_r, server_w = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        pumps = [
            asyncio.create_task(self._pump(client_r, server_w, replies=False)),
            asyncio.create_task(self._pump(server_r, client_w, replies=True)),
        ]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        for writer in (client_w, server_w):
            writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, replies: bool
    ) -> None:
        while chunk := await reader.read(65536):
            if replies and self._stalled.is_set():
                await asyncio.Event().wait()  # hold the reply forever (until cancelled)
            if replies and self._cut_after is not None:
                allowed, self._cut_after = self._cut_after, None
                writer.write(chunk[:allowed])
                await writer.drain()
                return  # the connection drops with part of the replies delivered
            writer.write(chunk)
            await writer.drain()


@contextlib.asynccontextmanager
async def faulty_proxy(redis_url: str) -> AsyncIterator[FaultyProxy]:
    """A started proxy in front of `redis_url`, stopped at the end."""
    target = urlparse(redis_url)
    proxy = FaultyProxy(target.hostname or "127.0.0.1", target.port or 6379)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
