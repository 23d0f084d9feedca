"""The HTTP/1.1 client of deliveries: keep-alive connections per endpoint, each opened to an
address the check allows, answers parsed by httptools (the parser uvicorn serves with).

Why not aiohttp: its client cost several times this one's CPU per POST
(docs/benchmarks-findings.md). Deliveries share the serving process's one
event loop, so that CPU comes out of the requests it serves. A delivery needs little of
what aiohttp offers: one method, no cookies, no redirects, no decompression, a body read
only up to a bound.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote, urlsplit

import httptools

from groupbuy.webhooks.addresses import AddressRefused, forbidden

# A resolved name is used this long: short, so the addresses connected to follow the
# name's records closely (each one still passes the check when connected to).
DNS_TTL_S = 10.0
# An idle connection older than this is closed rather than reused: most servers close
# theirs after 5-75 s, and a request sent as the server closes is lost.
IDLE_S = 4.0
# The most bytes read before an answer's headers end (its status line and headers): the
# body has its own bound, and a head that never ends must not grow without one.
MAX_HEAD_BYTES = 16 * 1024
# How long closing a pool waits for its connections to go (a TLS close is a short exchange).
CLOSE_S = 1.0
# Characters a request target keeps as they are; others are percent-encoded (as a browser
# sends an IRI's path).
_TARGET_SAFE = "/:@!$&'()*+,;=-._~%?"


class ConnectionClosed(Exception):
    """The peer closed the connection before its answer ended."""


class ConnectFailed(Exception):
    """No connection could be opened to any address of the host."""


class ProtocolError(Exception):
    """The peer's bytes were not an HTTP/1.1 answer."""


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its status, its Retry-After, and up to the bound of its body."""

    status: int
    retry_after: str | None
    body: bytes


@dataclass(frozen=True)
class Origin:
    """Where an endpoint's requests go: the scheme, host and port connected to, and the
    request line's target and Host header."""

    tls: bool
    host: str  # ASCII (IDNA) host name or IP address, no brackets
    port: int
    host_header: str
    target: str

    @classmethod
    def of(cls, url: str) -> Origin:
        """The origin of a URL that passed `addresses.url_problem`."""
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        hostname = parts.hostname or ""
        try:
            host = hostname.encode("idna").decode("ascii")
        except UnicodeError:
            host = hostname
        port = parts.port or (443 if tls else 80)
        shown = f"[{host}]" if ":" in host else host
        default = port == (443 if tls else 80)
        target = quote(parts.path or "/", safe=_TARGET_SAFE)
        if parts.query:
            target += "?" + quote(parts.query, safe=_TARGET_SAFE)
        return cls(tls, host, port, shown if default else f"{shown}:{port}", target)


class _Connection(asyncio.Protocol):
    """One connection and its parser: one request at a time, its answer into a future."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.lost = asyncio.Event()  # set once the transport is gone (a TLS close takes turns)
        self.idle_since = time.monotonic()
        self._waiter: asyncio.Future[Answer] | None = None
        self._status = 0
        self._retry_after: str | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._framed = False  # Content-Length or chunked: the end is known without a close
        self._heard = False  # a byte of this answer has arrived
        self._head_bytes = 0  # bytes of this answer read before its headers ended
        self._keep = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but offer its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: the connection cannot be trusted
            return
        self._heard = True
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as error:
            self._fail(ProtocolError(str(error) or type(error).__name__))
            return
        if not self._status:  # the head has not ended yet
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(ProtocolError(f"the answer's head is over {MAX_HEAD_BYTES} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost.set()
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._status and not self._framed:
            self._finish(complete=True)  # the answer's body ends with the connection
        else:
            self._fail(ConnectionClosed("the connection closed before the answer ended"))

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self._status = 0
        self._retry_after = None
        self._chunks = []
        self._size = 0
        self._framed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"retry-after":
            self._retry_after = value.decode("latin-1").strip()
        elif lowered in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self._status < 200 or self._waiter is None or self._waiter.done():
            return
        room = self._limit - self._size
        if len(body) > room:
            # Past the bound: the rest is not waited for, and the connection goes with it.
            self._chunks.append(body[:room])
            self._size = self._limit
            self._finish(complete=False)
            self.close()
            return
        self._chunks.append(body)
        self._size += len(body)

    def on_message_complete(self) -> None:
        if self._status < 200:
            return  # an interim answer (100 Continue): the final one follows
        self._keep = self._parser.should_keep_alive()
        self._finish(complete=True)

    # the request

    async def exchange(self, request: bytes) -> Answer:
        """Send one request and wait for its answer (the caller bounds the wait)."""
        if self.transport is None:
            raise ConnectionClosed("the connection was never made")
        self._waiter = asyncio.get_running_loop().create_future()
        self._heard = False
        self._head_bytes = 0
        self._keep = False
        self.on_message_begin()
        self.transport.write(request)
        try:
            return await self._waiter
        finally:
            self._waiter = None

    @property
    def heard(self) -> bool:
        """Whether any byte of the last answer arrived."""
        return self._heard

    @property
    def reusable(self) -> bool:
        """Whether the connection may carry another request now."""
        return (
            self._keep
            and not self.closed
            and self.transport is not None
            and not self.transport.is_closing()
            and time.monotonic() - self.idle_since < IDLE_S
        )

    def _finish(self, complete: bool) -> None:
        if self._waiter is not None and not self._waiter.done():
            body = b"".join(self._chunks)
            self._waiter.set_result(Answer(self._status, self._retry_after, body))
        if not complete:
            self._keep = False

    def _fail(self, error: Exception) -> None:
        self._keep = False
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)
        self.close()

    def close(self) -> None:
        """Close the connection now."""
        self._keep = False
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


class Pool:
    """At most `size` connections to one origin, kept open between requests."""

    def __init__(
        self,
        url: str,
        origin: Origin,
        size: int,
        limit: int,
        allow_private_networks: bool,
        ssl_context: ssl.SSLContext | None,
        user_agent: str,
    ) -> None:
        self.url = url
        self.origin = origin
        self._limit = limit
        self._allow_private = allow_private_networks
        self._ssl = ssl_context if origin.tls else None
        self._slots = asyncio.Semaphore(size)
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._addresses: list[tuple[int, tuple[object, ...]]] = []
        self._resolved_at = -DNS_TTL_S
        self._head = (
            f"POST {origin.target} HTTP/1.1\r\nhost: {origin.host_header}\r\n"
            f"user-agent: {user_agent}\r\ncontent-type: application/json\r\n"
        )

    async def post(self, body: bytes, headers: dict[str, str]) -> Answer:
        """POST `body` with `headers`; raises ConnectFailed, AddressRefused, ConnectionClosed,
        ProtocolError or OSError for what the network did (the caller bounds the time)."""
        lines = "".join(f"{name}: {_header_value(value)}\r\n" for name, value in headers.items())
        request = f"{self._head}{lines}content-length: {len(body)}\r\n\r\n".encode("latin-1")
        request += body
        async with self._slots:
            connection = self._reused()
            if connection is not None:
                try:
                    return await self._exchange(connection, request)
                except (ConnectionClosed, OSError):
                    if connection.heard:
                        raise
                    # Closed by the server while idle, before it read a byte of ours that
                    # it answered: sent again once, on a new connection.
            return await self._exchange(await self._connect(), request)

    async def _exchange(self, connection: _Connection, request: bytes) -> Answer:
        done = False
        try:
            answer = await connection.exchange(request)
            done = True
            return answer
        finally:
            # Anything but a whole answer (a timeout, a cancel, an error) closes it.
            if done and connection.reusable:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
            else:
                connection.close()
                self._open.discard(connection)

    def _reused(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable:
                return connection
            connection.close()
            self._open.discard(connection)
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        refused: list[str] = []
        failures: list[str] = []
        for family, sockaddr in await self._resolve():
            address = str(sockaddr[0])
            if not self._allow_private and forbidden(address):
                refused.append(address)
                continue
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, sockaddr)
                _, connection = await loop.create_connection(
                    lambda: _Connection(self._limit),
                    sock=sock,
                    ssl=self._ssl,
                    server_hostname=self.origin.host if self._ssl is not None else None,
                )
            except OSError as error:  # ssl.SSLError included
                sock.close()
                failures.append(f"{address}: {error}")
                continue
            except BaseException:
                sock.close()
                raise
            self._open.add(connection)
            return connection
        if refused and not failures:
            raise AddressRefused(f"refused to connect to {', '.join(refused)}: not public")
        raise ConnectFailed("; ".join(failures) or f"no address for {self.origin.host}")

    async def _resolve(self) -> list[tuple[int, tuple[object, ...]]]:
        """The host's addresses, asked again once DNS_TTL_S has passed."""
        if time.monotonic() - self._resolved_at < DNS_TTL_S and self._addresses:
            return self._addresses
        try:
            found = await asyncio.get_running_loop().getaddrinfo(
                self.origin.host, self.origin.port, type=socket.SOCK_STREAM
            )
        except OSError as error:
            raise ConnectFailed(f"the host {self.origin.host!r} does not resolve") from error
        self._addresses = [(info[0], info[4]) for info in found]
        self._resolved_at = time.monotonic()
        return self._addresses

    async def aclose(self) -> None:
        """Close every connection of the pool, waiting (bounded) until they are gone."""
        connections, self._idle = list(self._open), []
        self._open.clear()
        for connection in connections:
            connection.close()
        waits = [asyncio.ensure_future(c.lost.wait()) for c in connections if c.transport]
        if waits:
            _done, pending = await asyncio.wait(waits, timeout=CLOSE_S)
            for wait in pending:
                wait.cancel()
        for connection in connections:
            if not connection.lost.is_set() and connection.transport is not None:
                connection.transport.abort()


def _header_value(value: str) -> str:
    """A header value as sent; one that would break the request's framing is refused."""
    if "\r" in value or "\n" in value:
        raise ValueError("a header value must not contain CR or LF")
    return value
