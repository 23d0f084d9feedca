"""The deliveries' HTTP/1.1 client against servers that misbehave on purpose: raw asyncio
servers on loopback that answer exactly the bytes a test gives them, and a TLS receiver
with a certificate made for the test."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from groupbuy.webhooks.http1 import MAX_HEAD_BYTES, Origin
from groupbuy.webhooks.sender import KEPT_ANSWER_BYTES, MAX_ANSWER_BYTES, Reply, Sender
from tests.support.receiver import serving_thread
from tests.support.servers import free_port

Handler = Callable[[int, bytes], Awaitable[bytes | None]]


Run = Callable[[Callable[[], Coroutine[Any, Any, None]]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Runs a test's body on asyncio's loop or on uvloop (`groupbuy serve` runs uvloop)."""

    def on_loop(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if request.param == "uvloop":
            uvloop.run(body())
        else:
            asyncio.run(body())

    return on_loop


@dataclass
class RawServer:
    """A loopback server that hands each request (its connection's number and its bytes) to
    `handler`, writes back what it returns, and closes the connection on None (and after
    every answer with `close_after`)."""

    handler: Handler
    close_after: bool = False
    port: int = 0
    requests: list[tuple[int, bytes]] = field(default_factory=list)
    connections: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                request = head + await reader.readexactly(length)
                self.requests.append((number, request))
                answer = await self.handler(number, request)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        """The URL to POST to."""
        return f"http://127.0.0.1:{self.port}/hook"


@contextlib.asynccontextmanager
async def raw(handler: Handler, close_after: bool = False) -> AsyncIterator[RawServer]:
    """A RawServer on a free loopback port for the block."""
    raw_server = RawServer(handler, close_after)
    server = await asyncio.start_server(raw_server.serve, "127.0.0.1", 0)
    raw_server.port = server.sockets[0].getsockname()[1]
    try:
        yield raw_server
    finally:
        server.close()


def ok(body: bytes = b"ok") -> bytes:
    """A keep-alive 200 with `body`."""
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def post_all(
    url: str, *bodies: bytes, headers: dict[str, str] | None = None, private: bool = True
) -> list[Reply]:
    """POST each body in turn from one Sender, closed afterwards."""
    client = Sender(timeout_s=2.0, max_connections=2, allow_private_networks=private)
    try:
        return [await client.post("e1", url, body, headers or {}) for body in bodies]
    finally:
        await client.aclose()


def test_a_post_carries_the_body_headers_and_host_and_reuses_its_connection(run: Run) -> None:
    async def answer(_number: int, _request: bytes) -> bytes:
        return ok(b"thanks")

    async def body() -> None:
        async with raw(answer) as server:
            first, second = await post_all(
                server.url, b'{"a":1}', b'{"a":2}', headers={"webhook-id": "evt_1"}
            )
        assert (first.status_code, first.answer, first.error) == (200, b"thanks", None)
        assert second.status_code == 200
        assert [number for number, _ in server.requests] == [1, 1]  # one connection, kept
        request = server.requests[0][1]
        assert request.startswith(b"POST /hook HTTP/1.1\r\n")
        assert f"host: 127.0.0.1:{server.port}\r\n".encode() in request
        assert b"content-type: application/json\r\n" in request
        assert b"webhook-id: evt_1\r\n" in request
        assert request.endswith(b'\r\n\r\n{"a":1}')

    run(body)


def test_a_connection_the_server_closed_while_idle_is_replaced_once(run: Run) -> None:
    """The server closes the kept connection as the next request arrives (its idle timeout
    and the request crossing): the request goes again on a new connection."""
    requests: list[int] = []

    async def answer(number: int, _request: bytes) -> bytes | None:
        requests.append(number)
        if requests == [1, 1]:
            return None  # closes without a byte of answer
        return ok()

    async def body() -> None:
        async with raw(answer) as server:
            first, second = await post_all(server.url, b"{}", b"{}")
        assert first.status_code == 200
        assert (second.status_code, second.error) == (200, None)
        assert requests == [1, 1, 2]

    run(body)


def test_a_fresh_connection_closed_before_the_answer_is_not_sent_again(run: Run) -> None:
    async def answer(_number: int, _request: bytes) -> bytes | None:
        return None

    async def body() -> None:
        async with raw(answer) as server:
            [reply] = await post_all(server.url, b"{}")
        assert (reply.status_code, reply.error) == (None, "connection_closed")
        assert len(server.requests) == 1

    run(body)


def test_an_answer_ended_by_the_close_is_whole(run: Run) -> None:
    async def answer(_number: int, _request: bytes) -> bytes | None:
        return b"HTTP/1.0 202 Accepted\r\nretry-after: 7\r\n\r\nqueued, thanks"

    async def body() -> None:
        async with raw(answer, close_after=True) as server:
            first, second = await post_all(server.url, b"{}", b"{}")
        assert (first.status_code, first.answer, first.retry_after) == (
            202,
            b"queued, thanks",
            "7",
        )
        assert second.status_code == 202
        assert [number for number, _ in server.requests] == [1, 2]  # HTTP/1.0: not kept

    run(body)


def test_an_interim_answer_is_skipped_and_chunked_bodies_are_read(run: Run) -> None:
    async def answer(_number: int, _request: bytes) -> bytes:
        return (
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 500 Oops\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )

    async def body() -> None:
        async with raw(answer) as server:
            [reply] = await post_all(server.url, b"{}")
        assert (reply.status_code, reply.answer, reply.error) == (500, b"abcde", None)

    run(body)


def test_an_answer_past_the_bound_keeps_its_status_and_closes(run: Run) -> None:
    async def answer(_number: int, _request: bytes) -> bytes:
        return ok(b"y" * (MAX_ANSWER_BYTES + 10))

    async def body() -> None:
        async with raw(answer) as server:
            first, second = await post_all(server.url, b"{}", b"{}")
        assert (first.status_code, first.answer) == (200, b"y" * KEPT_ANSWER_BYTES)
        assert second.status_code == 200
        assert [number for number, _ in server.requests] == [1, 2]  # the rest not read

    run(body)


def test_a_head_that_never_ends_is_cut_at_its_bound(run: Run) -> None:
    async def answer(_number: int, _request: bytes) -> bytes:
        header = b"x-filler: " + b"y" * 1000 + b"\r\n"
        return b"HTTP/1.1 200 OK\r\n" + header * (MAX_HEAD_BYTES // len(header) + 2)

    async def body() -> None:
        async with raw(answer) as server:
            [reply] = await post_all(server.url, b"{}")
        assert (reply.status_code, reply.error) == (None, "connection_error: ProtocolError")

    run(body)


def test_bytes_that_are_not_http_are_an_error_not_a_status(run: Run) -> None:
    async def answer(_number: int, _request: bytes) -> bytes:
        return b"SSH-2.0-OpenSSH_9.2\r\n\r\n"

    async def body() -> None:
        async with raw(answer) as server:
            [reply] = await post_all(server.url, b"{}")
        assert reply.status_code is None
        assert reply.error == "connection_error: ProtocolError"

    run(body)


def test_a_header_value_that_would_split_the_request_is_refused_unsent(run: Run) -> None:
    async def answer(_number: int, _request: bytes) -> bytes:
        return ok()

    async def body() -> None:
        async with raw(answer) as server:
            [reply] = await post_all(server.url, b"{}", headers={"webhook-id": "a\r\nx-evil: 1"})
        assert reply.status_code is None and reply.error == "connection_error: ValueError"
        assert server.requests == []

    run(body)


def test_nothing_is_connected_to_when_every_address_is_refused(run: Run) -> None:
    async def body() -> None:
        [reply] = await post_all("http://localhost:9/hook", b"{}", private=False)
        assert (reply.status_code, reply.error) == (None, "address_refused")

    run(body)


def test_a_port_nobody_listens_on_is_connect_failed(run: Run) -> None:
    async def body() -> None:
        [reply] = await post_all(f"http://127.0.0.1:{free_port()}/hook", b"{}")
        assert (reply.status_code, reply.error) == (None, "connect_failed")

    run(body)


@pytest.mark.parametrize(
    ("url", "host_header", "target"),
    [
        ("https://shop.example/hooks", "shop.example", "/hooks"),
        ("https://shop.example:8443", "shop.example:8443", "/"),
        ("http://shop.example:80/a?b=1&c=d%20e", "shop.example", "/a?b=1&c=d%20e"),
        ("https://bücher.example/wö rk", "xn--bcher-kva.example", "/w%C3%B6%20rk"),
        ("https://[2001:db8::1]:444/x", "[2001:db8::1]:444", "/x"),
    ],
)
def test_the_request_line_and_host_of_a_url(url: str, host_header: str, target: str) -> None:
    origin = Origin.of(url)
    assert (origin.host_header, origin.target) == (host_header, target)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (openssl, as Debian ships it)."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        + ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_receiver(certificate: tuple[Path, Path]) -> Iterator[tuple[str, list[bytes]]]:
    bodies: list[bytes] = []

    async def hook(request: Request) -> Response:
        bodies.append(await request.body())
        return Response(b"secure", 200)

    port = free_port()
    config = uvicorn.Config(
        Starlette(routes=[Route("/hook", hook, methods=["POST"])]),
        host="127.0.0.1",
        port=port,
        log_level="critical",
        lifespan="off",
        ssl_certfile=str(certificate[0]),
        ssl_keyfile=str(certificate[1]),
    )
    yield from serving_thread(uvicorn.Server(config), (f"https://127.0.0.1:{port}/hook", bodies))


def test_https_checks_the_certificate(
    run: Run, certificate: tuple[Path, Path], tls_receiver: tuple[str, list[bytes]]
) -> None:
    url, bodies = tls_receiver

    async def body() -> None:
        context = ssl.create_default_context(cafile=str(certificate[0]))
        trusting = Sender(2.0, 2, True, context)
        default = Sender(2.0, 2, True)  # the system's trust store: a self-signed one fails
        try:
            trusted = await trusting.post("e1", url, b'{"n":1}', {})
            refused = await default.post("e1", url, b'{"n":2}', {})
        finally:
            await trusting.aclose()
            await default.aclose()
        assert (trusted.status_code, trusted.answer) == (200, b"secure")
        assert (refused.status_code, refused.error) == (None, "connect_failed")

    run(body)
    assert bodies == [b'{"n":1}']
