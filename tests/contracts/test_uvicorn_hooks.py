"""uvicorn's httptools protocol, Server and Multiprocess supervisor, as groupbuy/api/server.py
subclasses them (GuardedHttpToolsProtocol, AnnouncingServer, AnnouncingMultiprocess)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState
from uvicorn.supervisors.multiprocess import Multiprocess

from tests.contracts.uvicorn_workers import LifespanApp, MarkedConfig

# Bounds for the waits below: generous for a loaded machine, never reached when it works.
WAIT_S = 30.0


def listening_socket() -> socket.socket:
    """A bound socket as groupbuy.api.server.bind makes one (uvicorn listens on it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.set_inheritable(True)
    return sock


class RecordingProtocol(HttpToolsProtocol):
    """Records what uvicorn and httptools call, and whether inside data_received."""

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.given = (config, server_state, app_state)
        self.events: list[tuple[str, bool]] = []  # (what, called inside data_received)
        self.feeding = False
        self.chunks = 0
        self.cycle_complete_seen: list[bool] = []
        self.refusals: list[str] = []
        recorded: list[RecordingProtocol] = config.recorded  # type: ignore[attr-defined]
        recorded.append(self)

    def names(self) -> list[str]:
        return [name for name, _inside in self.events]

    def _saw(self, name: str) -> None:
        self.events.append((name, self.feeding))

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._saw("made")

    def connection_lost(self, exc: Exception | None) -> None:
        self._saw("lost")
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.feeding = True
        try:
            super().data_received(data)
        finally:
            self.feeding = False
            self.chunks += 1

    def send_400_response(self, msg: str) -> None:
        self.refusals.append(msg)
        super().send_400_response(msg)

    def on_message_begin(self) -> None:
        self._saw("begin")
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._saw("url")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._saw(f"header {name.decode().lower()}: {value.decode()}")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._saw("headers_complete")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._saw(f"body {body.decode()}")
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._saw("message_complete")
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.cycle_complete_seen.append(self.cycle is None or self.cycle.response_complete)


class Echo:
    """Answers each request with its body; a request to /first waits until the
    connection's next request has its head parsed (a pipelined request)."""

    def __init__(self, recorded: list[RecordingProtocol]) -> None:
        self.recorded = recorded

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/first":
            await until(lambda: self.recorded[0].names().count("headers_complete") >= 2)
        body = body or scope["path"].encode()
        headers = [(b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def until(condition: Callable[[], bool]) -> None:
    """Wait until `condition()` holds (a bounded poll)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def recording_config(**options: Any) -> uvicorn.Config:
    recorded: list[RecordingProtocol] = []
    config = uvicorn.Config(
        Echo(recorded), http=RecordingProtocol, lifespan="off", log_level="warning", **options
    )
    config.recorded = recorded  # type: ignore[attr-defined]
    return config


@contextlib.asynccontextmanager
async def serving(server: uvicorn.Server) -> AsyncIterator[int]:
    """Serve in this event loop on a socket of our own, as the single-worker path does
    (AnnouncingServer(config).run(sockets=[sock])); yields the port."""
    sock = listening_socket()
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: server.started or task.done())
        assert server.started
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT_S)
        sock.close()


async def exchange(port: int, *parts: bytes, between: Callable[[], bool] | None = None) -> bytes:
    """Send `parts` on one connection (waiting for `between` after each but the last) and
    read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for n, part in enumerate(parts):
            writer.write(part)
            await writer.drain()
            if between is not None and n < len(parts) - 1:
                await until(between)
        return await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_config_http_class_is_the_protocol_the_server_builds_per_connection() -> None:
    """groupbuy/api/server.py, ServerConfig.__init__ and GuardedHttpToolsProtocol.__init__ /
    connection_made / connection_lost: Config(http=<class>) makes the server build that
    class for each connection with (config, server_state, app_state, _loop); `self.loop`
    is the serving loop and `self.transport` the connection's transport."""
    config = recording_config()
    async with serving(uvicorn.Server(config)) as port:
        answer = await exchange(
            port, b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        [protocol] = config.recorded  # type: ignore[attr-defined]
        await until(lambda: "lost" in protocol.names())
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"/hello")
    given_config, server_state, app_state = protocol.given
    assert given_config is config
    assert isinstance(server_state, ServerState)
    assert isinstance(app_state, dict)
    assert protocol.loop is asyncio.get_running_loop()
    assert isinstance(protocol.transport, asyncio.Transport)
    assert protocol.names()[0] == "made" and protocol.names()[-1] == "lost"


async def test_httptools_protocol_parser_callbacks_run_in_order_inside_data_received() -> None:
    """groupbuy/api/server.py, GuardedHttpToolsProtocol.data_received and its parser
    callbacks (on_message_begin, on_url, on_header, on_headers_complete, on_body,
    on_message_complete): httptools calls the subclass's callbacks, in order, during
    super().data_received(chunk), so the head's state is known when it returns;
    on_header gets each header's raw name and value."""
    config = recording_config()
    recorded: list[RecordingProtocol] = config.recorded  # type: ignore[attr-defined]
    head_start = b"POST /echo HTTP/1.1\r\nHost: t\r\nX-One: 1\r\n"
    rest = b"X-Two: 22\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"
    async with serving(uvicorn.Server(config)) as port:
        answer = await exchange(
            port, head_start, rest, between=lambda: bool(recorded) and recorded[0].chunks >= 1
        )
    [protocol] = recorded
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"abc")
    parsed = [event for event in protocol.events if event[0] not in ("made", "lost")]
    assert [name for name, _inside in parsed] == [
        "begin",
        "url",
        "header host: t",
        "header x-one: 1",
        "header x-two: 22",
        "header content-length: 3",
        "header connection: close",
        "headers_complete",
        "body abc",
        "message_complete",
    ]
    assert all(inside for _name, inside in parsed)


async def test_on_response_complete_sees_the_cycle_complete_unless_a_pipelined_request_waits() -> (
    None
):
    """groupbuy/api/server.py, GuardedHttpToolsProtocol.on_response_complete: after
    super().on_response_complete(), `self.cycle.response_complete` is true when the
    connection waits for a new head, and false when a pipelined request (its head already
    parsed) is the current cycle."""
    config = recording_config()
    pipelined = (
        b"GET /first HTTP/1.1\r\nHost: t\r\n\r\n"
        b"GET /second HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    async with serving(uvicorn.Server(config)) as port:
        answer = await exchange(port, pipelined)
    [protocol] = config.recorded  # type: ignore[attr-defined]
    assert answer.count(b"HTTP/1.1 200 ") == 2 and answer.endswith(b"/second")
    assert protocol.cycle_complete_seen == [False, True]


async def test_send_400_response_is_called_for_a_request_head_httptools_cannot_parse() -> None:
    """groupbuy/api/server.py, GuardedHttpToolsProtocol.send_400_response: uvicorn answers
    a head the parser refuses through send_400_response(msg), which the subclass can
    silence once it has refused the head itself."""
    config = recording_config()
    async with serving(uvicorn.Server(config)) as port:
        answer = await exchange(port, b"GET /\x01bad HTTP/1.1\r\nHost: t\r\n\r\n")
    [protocol] = config.recorded  # type: ignore[attr-defined]
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert len(protocol.refusals) == 1 and protocol.refusals[0]


class ListeningServer(uvicorn.Server):
    """What AnnouncingServer does after super().startup(): here, a request to the app."""

    def __init__(self, config: uvicorn.Config, port: int) -> None:
        super().__init__(config)
        self.port = port
        self.answers: list[bytes] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            request = b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            self.answers.append(await exchange(self.port, request))


async def test_server_startup_returns_with_started_set_once_the_app_serves() -> None:
    """groupbuy/api/server.py, AnnouncingServer.startup: serve() calls startup(sockets=...);
    once super().startup() returns with `started` true and `should_exit` false, the
    lifespan has run and the socket already serves requests."""
    app = LifespanApp()
    config = uvicorn.Config(app, lifespan="on", log_level="warning")
    sock = listening_socket()
    server = ListeningServer(config, sock.getsockname()[1])
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: bool(server.answers) or task.done())
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT_S)
        sock.close()
    [answer] = server.answers
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nstarted")


async def test_server_startup_exits_with_startup_failure_when_the_lifespan_fails() -> None:
    """groupbuy/api/server.py, AnnouncingServer.startup (and cli._run_server, which
    suppresses the SystemExit): when the app's lifespan fails, super().startup() raises
    SystemExit(STARTUP_FAILURE) and the code after it does not run."""
    config = uvicorn.Config(LifespanApp(fail=True), lifespan="on", log_level="critical")
    sock = listening_socket()
    server = ListeningServer(config, sock.getsockname()[1])
    try:
        # Awaited here, not in a task: the event loop re-raises a task's SystemExit itself.
        with pytest.raises(SystemExit) as exited:
            await server.serve(sockets=[sock])
    finally:
        sock.close()
    assert exited.value.code == STARTUP_FAILURE == 3
    assert not server.started
    assert server.answers == []


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Multiprocess() installs handlers for a dozen signals in this process: put them back."""
    kept = {sig: signal.getsignal(sig) for sig in signal.Signals}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if signal.getsignal(sig) is not handler and handler is not None:
                signal.signal(sig, handler)


def get(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        return answer


def test_multiprocess_init_processes_starts_workers_on_the_pickled_config() -> None:
    """groupbuy/api/server.py, AnnouncingMultiprocess.init_processes (and ServerConfig, whose
    head limits travel to the workers): Multiprocess(config, sockets) has `signal_queue`
    and `should_exit`; init_processes() fills `processes`, each with `.process.is_alive()`
    and `.is_ready(timeout=)`, true once its server has started; each worker serves with
    the config's own protocol class and attributes."""
    sock = listening_socket()
    config = MarkedConfig(
        "tests.contracts.uvicorn_workers:serving",
        marker="marker-41",
        workers=1,
        log_level="warning",
    )
    with signal_handlers_kept():
        supervisor = Multiprocess(config, [sock])
        assert supervisor.signal_queue == []
        assert isinstance(supervisor.should_exit, threading.Event)
        try:
            supervisor.init_processes()
            assert len(supervisor.processes) == 1
            deadline = time.monotonic() + WAIT_S
            waiting = list(supervisor.processes)
            while waiting and time.monotonic() < deadline:
                assert all(p.process.is_alive() for p in waiting)
                waiting = [p for p in waiting if not p.is_ready(timeout=0.5)]
            assert waiting == []
            answer = get(sock.getsockname()[1])
        finally:
            supervisor.should_exit.set()
            supervisor.terminate_all()
            supervisor.join_all()
            sock.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nmarker-41")


def test_multiprocess_keep_subprocess_alive_stops_on_a_worker_startup_failure() -> None:
    """groupbuy/api/server.py, AnnouncingMultiprocess.keep_subprocess_alive: a worker whose
    app fails to start exits with STARTUP_FAILURE; keep_subprocess_alive() then sets
    `should_exit` without replacing it, and the failed worker stays in `processes` with
    that `exitcode`."""
    sock = listening_socket()
    config = uvicorn.Config(
        "tests.contracts.uvicorn_workers:failing", workers=1, lifespan="on", log_level="critical"
    )
    with signal_handlers_kept():
        supervisor = Multiprocess(config, [sock])
        try:
            supervisor.init_processes()
            [worker] = supervisor.processes
            worker.process.join(timeout=WAIT_S)
            assert worker.exitcode == STARTUP_FAILURE
            supervisor.keep_subprocess_alive()
            assert supervisor.should_exit.is_set()
            assert supervisor.processes == [worker]
        finally:
            supervisor.should_exit.set()
            supervisor.terminate_all()
            supervisor.join_all()
            sock.close()
