"""How uvicorn serves the app: the HTTP protocol with our limits on the request head, the
listening socket, and the moment the service really listens.

uvicorn's HTTP protocols have no timeout for a request's head: a connection that sends
nothing, or a header a byte at a time, is held for ever (only the keep-alive pause
between two requests is timed). Nor do they bound the number or size of the headers
(httptools gathers a header of any length in memory). GuardedHttpToolsProtocol adds
both to uvicorn's httptools protocol:

- a head timer, armed when a connection opens and when the first byte of a later
  request arrives, cancelled when the head is complete: past `header_timeout_s` the
  connection is closed (no answer: a client that has not sent its head yet is given no
  more bytes to read);
- counts of the head's headers and bytes (request line included): past
  `max_header_count` or `max_header_bytes` the answer is 431 problem+json
  `headers_too_large` and the connection is closed, before the app is called (after a
  second of reading and dropping what still arrives, so the client gets the answer).

The body is timed by the app (groupbuy.api.middleware.LimitBodyTime), which can answer
408 through the usual error handling.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState
from uvicorn.supervisors.multiprocess import Multiprocess

from groupbuy import errors
from groupbuy.api.problems import problem_body
from groupbuy.console import streams
from groupbuy.settings import ServerSettings


@dataclass(frozen=True)
class HeadLimits:
    """What a request's head may take: time, headers, bytes (request line included)."""

    header_timeout_s: float
    max_header_count: int
    max_header_bytes: int

    @classmethod
    def of(cls, server: ServerSettings) -> HeadLimits:
        """The limits the [server] settings give."""
        return cls(server.header_timeout_s, server.max_header_count, server.max_header_bytes)


class ServerConfig(uvicorn.Config):
    """uvicorn's Config carrying our head limits to the protocol (it is pickled into every
    worker process of `--workers N`, so the limits travel with it)."""

    def __init__(self, app: Any, head_limits: HeadLimits, **options: Any) -> None:
        # No log_config: uvicorn's lines go through the root logger, in the [log] format,
        # rather than through a format of its own; its access lines are ours (groupbuy.access).
        options.setdefault("log_config", None)
        options.setdefault("access_log", False)
        # The client address is the app's business ([auth] trusted_proxies, api/app.py):
        # uvicorn's own X-Forwarded-For handling would trust any peer on 127.0.0.1.
        options.setdefault("proxy_headers", False)
        super().__init__(app, http=GuardedHttpToolsProtocol, **options)
        self.head_limits = head_limits


# How long a refused connection is read (and what arrives dropped) before it is closed.
_LINGER_S = 1.0


def _refusal(error: errors.GroupBuyError) -> bytes:
    body = orjson.dumps(problem_body(error))
    return b"".join(
        [
            f"HTTP/1.1 {error.status_code} {error.title}\r\n".encode("latin-1"),
            b"content-type: application/problem+json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a timeout and size limits on the request head."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = getattr(config, "head_limits", None)
        if not isinstance(limits, HeadLimits):
            limits = HeadLimits.of(ServerSettings())
        self.head_limits = limits
        self._head_timer: asyncio.TimerHandle | None = None
        self._awaiting_head = True
        self._head_count = 0
        self._head_bytes = 0
        self._unparsed_head_bytes = 0
        self._refused = False

    # -- the head timer ------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.head_limits.header_timeout_s, self._head_timed_out
            )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._awaiting_head and not self.transport.is_closing():
            self.transport.close()

    # -- connection events ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that never sends a byte is timed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        was_awaiting = self._awaiting_head
        if was_awaiting:
            self._arm_head_timer()  # after a keep-alive pause: the next head's first bytes
        super().data_received(data)
        if was_awaiting and self._awaiting_head and not self._refused:
            # The whole chunk is part of an unfinished head (httptools holds an unfinished
            # header in memory, unbounded): count it before a header ends.
            self._unparsed_head_bytes += len(data)
            if self._unparsed_head_bytes > self.head_limits.max_header_bytes:
                self._refuse_head()

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # the rest of a refused head is not worth another answer
            super().send_400_response(msg)

    # -- parser callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._awaiting_head = True
        self._head_count = self._head_bytes = self._unparsed_head_bytes = 0
        self._arm_head_timer()
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(url)
        if self._head_bytes > self.head_limits.max_header_bytes:
            self._refuse_head()
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_count += 1
        self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if (
            self._head_count > self.head_limits.max_header_count
            or self._head_bytes > self.head_limits.max_header_bytes
        ):
            self._refuse_head()
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._awaiting_head = False
        self._unparsed_head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Waiting for the next head, unless a pipelined request (head complete) just started.
        self._awaiting_head = self.cycle is None or self.cycle.response_complete

    def _refuse_head(self) -> None:
        self._refused = True
        self._cancel_head_timer()
        limits = self.head_limits
        error = errors.HeadersTooLarge(
            f"a request's head may hold at most {limits.max_header_count} headers and "
            f"{limits.max_header_bytes} bytes",
            max_header_count=limits.max_header_count,
            max_header_bytes=limits.max_header_bytes,
        )
        if self.transport.is_closing():
            return
        self.transport.write(_refusal(error))
        # Closing at once while the client still sends its head would make the kernel
        # answer with a reset, which can destroy the 431 before the client reads it: end
        # our side, drop what still arrives, and close a moment later (a lingering close).
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(_LINGER_S, self.transport.close)
        else:
            self.transport.close()


class PortInUse(OSError):
    """The address to listen on is taken by another process."""


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything else starts, so that a port in use is
    one clear error (PortInUse) before the engine, the database or the workers start.

    As uvicorn binds it (SO_REUSEADDR, inheritable for `--workers N`), plus TCP_NODELAY:
    uvicorn binds with protocol 0, so asyncio does not turn Nagle off on the accepted
    connections and every keep-alive answer waits for a delayed ACK
    (docs/benchmarks-findings.md has the figures). Accepted sockets inherit the option
    from the listening one on Linux.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {port} on {host} is in use") from None
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


class AnnouncingServer(uvicorn.Server):
    """uvicorn's Server that calls `on_listening` once the app has started (the lifespan:
    Redis scripts loaded, tables there) and the socket accepts connections."""

    def __init__(self, config: uvicorn.Config, on_listening: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self._on_listening()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # The console's live streams never end by themselves: end them first, or the
        # server would wait for them until its graceful-shutdown timeout.
        streams.stop_all()
        await super().shutdown(sockets)


class AnnouncingMultiprocess(Multiprocess):
    """uvicorn's supervisor of `--workers N` that calls `on_listening` once every worker has
    started its app and serves, and stops them all when one fails to start, at first or
    when it replaces one that died (`failed_start` then says so, and the parent reports
    it)."""

    # Longest wait for the workers' start (each connects to Redis and the database).
    startup_timeout_s = 60.0

    def __init__(
        self,
        config: uvicorn.Config,
        sockets: list[socket.socket],
        on_listening: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config, sockets)
        self._on_listening = on_listening
        self.failed_start = False

    def init_processes(self) -> None:
        super().init_processes()
        deadline = time.monotonic() + self.startup_timeout_s
        waiting = list(self.processes)
        while waiting:
            if self.signal_queue or self.should_exit.is_set():
                return  # stopping: the main loop handles the signal
            if time.monotonic() > deadline or not all(p.process.is_alive() for p in waiting):
                self.failed_start = True  # a worker died starting, or hangs: stop them all
                self.should_exit.set()
                return
            waiting = [p for p in waiting if not p.is_ready(timeout=0.5)]
            if waiting:
                time.sleep(0.05)
        if self._on_listening is not None:
            self._on_listening()

    def keep_subprocess_alive(self) -> None:
        super().keep_subprocess_alive()
        # uvicorn stops every worker when one that replaced a dead one fails to start (exit
        # status STARTUP_FAILURE), as quietly as after a signal: the parent then exited 0.
        if self.should_exit.is_set() and any(p.exitcode == STARTUP_FAILURE for p in self.processes):
            self.failed_start = True
