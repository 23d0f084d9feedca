"""A real webhook receiver for the tests: a Starlette app under uvicorn on a free loopback
port, in a thread with its own event loop, scripted to answer each POST in turn (200, 500,
410, 429 with Retry-After, NUL bytes, a redirect, a hang past the timeout, a 1 MiB answer, a close
mid-answer), recording every request it got."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from tests.support.servers import free_port

T = TypeVar("T")


@dataclass(frozen=True)
class Received:
    """One POST as the receiver got it, and the answer the script gave."""

    headers: dict[str, str]
    body: bytes
    answer: str
    at: float
    client_port: int = 0  # the sender's local port (which process sent it)


@dataclass
class Receiver:
    """The scripted receiver; `script` answers in order, then `default` for the rest."""

    port: int
    script: list[str] = field(default_factory=list)
    default: str = "200"
    received: list[Received] = field(default_factory=list)
    hang_s: float = 30.0
    # Requests being answered now, and the most at once so far.
    active: int = 0
    most_active: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        """Where the receiver listens (a path of its own, so redirects have a target)."""
        return f"http://127.0.0.1:{self.port}/hook"

    def answer_with(self, *answers: str, default: str | None = None) -> None:
        """Answer the next POSTs with `answers` in order, then `default` (unchanged if None)."""
        with self._lock:
            self.script = list(answers)
            if default is not None:
                self.default = default

    def _next(self) -> str:
        with self._lock:
            return self.script.pop(0) if self.script else self.default

    async def handle(self, request: Request) -> Response:
        self.active += 1  # one event loop: no lock needed
        self.most_active = max(self.most_active, self.active)
        try:
            return await self._answer(request)
        finally:
            self.active -= 1

    async def _answer(self, request: Request) -> Response:
        body = await request.body()
        answer = self._next()
        port = request.client.port if request.client else 0
        self.received.append(Received(dict(request.headers), body, answer, time.monotonic(), port))
        code, _colon, arg = answer.partition(":")
        if code == "hang":
            await asyncio.sleep(self.hang_s)
            return Response(b"late", 200)
        if code == "slow":
            await asyncio.sleep(float(arg or "0.5"))
            return Response(b"slowly", 200)
        if code == "nul":  # an answer no text column takes as it is
            return Response(b"bad\x00answer", 500)
        if code == "big":
            return Response(b"x" * (1024 * 1024), 200)
        if code == "cut":
            return StreamingResponse(_cut_short(), 200)
        if code in ("429", "503"):
            return Response(b"slow down", int(code), headers={"retry-after": arg or "1"})
        if code in ("301", "302", "307", "308"):
            return Response(b"", int(code), headers={"location": "/elsewhere"})
        return Response(f"answer {code}".encode(), int(code))

    async def elsewhere(self, request: Request) -> Response:
        self.received.append(Received(dict(request.headers), b"", "elsewhere", time.monotonic()))
        return Response(b"followed", 200)

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[Received]:
        """The requests once at least `count` have arrived (AssertionError after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} of {count} arrived"
            time.sleep(0.01)
        return list(self.received)


async def arrived(receiver: Receiver, count: int, timeout_s: float = 10.0) -> list[Received]:
    """As Receiver.wait_for, from a coroutine: the test's loop goes on (its deliverer too)."""
    deadline = time.monotonic() + timeout_s
    while len(receiver.received) < count:
        assert time.monotonic() < deadline, f"{len(receiver.received)} of {count} arrived"
        await asyncio.sleep(0.01)
    return list(receiver.received)


async def _cut_short() -> AsyncIterator[bytes]:
    yield b"partial"
    raise ConnectionResetError("the receiver closes mid-answer")


def start_receiver(port: int | None = None) -> tuple[Receiver, uvicorn.Server, threading.Thread]:
    """A receiver listening on `port` (a free one when None), serving from its own thread."""
    receiver = Receiver(port or free_port())
    app = Starlette(
        routes=[
            Route("/hook", receiver.handle, methods=["POST"]),
            Route("/elsewhere", receiver.elsewhere, methods=["POST", "GET"]),
        ]
    )
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=receiver.port,
        log_level="critical",
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = _start_thread(server, f"receiver-{receiver.port}")
    return receiver, server, thread


def _start_thread(server: uvicorn.Server, name: str) -> threading.Thread:
    """Run `server` in a thread of its own, once it has started."""
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    return thread


def serving_thread(server: uvicorn.Server, value: T) -> Iterator[T]:
    """For a fixture: `server` running in a thread of its own while the test has `value`."""
    thread = _start_thread(server, "test-server")
    try:
        yield value
    finally:
        stop_receiver(server, thread)


def stop_receiver(server: uvicorn.Server, thread: threading.Thread) -> None:
    """Stop a receiver and wait for its thread."""
    server.should_exit = True
    thread.join(timeout=10)


def running_receiver(port: int | None = None) -> Iterator[Receiver]:
    """For a fixture: a receiver for the test, stopped at its end."""
    receiver, server, thread = start_receiver(port)
    try:
        yield receiver
    finally:
        stop_receiver(server, thread)


def local_ports(pid: int) -> set[int]:
    """The local TCP ports of a process's sockets (Linux /proc): which process a receiver's
    client was."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
