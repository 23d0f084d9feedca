"""The HTTP edges against a real uvicorn server on a loopback port: slow heads and bodies
are cut off, oversized heads refused, a client gone mid-body is no error, and ordinary
requests (keep-alive included) are untouched.

Each test starts the service as `groupbuy serve` does (groupbuy.api.server), with short
timeouts so that every wait here is a second or less.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from groupbuy.api.app import create_app
from groupbuy.api.server import AnnouncingServer, HeadLimits, ServerConfig, bind
from groupbuy.settings import Settings
from tests.support.database import sqlite_url
from tests.support.http import ADMIN_KEY
from tests.support.settings import settings_for

HEAD_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 0.6


@pytest.fixture
def edge_settings(tmp_path: Path) -> Settings:
    settings = settings_for("", sqlite_url(tmp_path))  # the edges are HTTP's, not Redis's or SQL's
    settings = settings.replace("scheduler", enabled=False)
    return settings.replace(
        "server",
        header_timeout_s=HEAD_TIMEOUT_S,
        body_timeout_s=BODY_TIMEOUT_S,
        max_header_count=100,
        max_header_bytes=16384,
    )


@pytest.fixture
def port(edge_settings: Settings) -> Iterator[int]:
    """The service listening on a free loopback port, served from a thread."""
    sock = bind("127.0.0.1", 0)
    config = ServerConfig(
        create_app(edge_settings),
        HeadLimits.of(edge_settings.server),
        host="127.0.0.1",
        port=sock.getsockname()[1],
        log_level="warning",
        timeout_keep_alive=5,
    )
    listening = threading.Event()
    server = AnnouncingServer(config, listening.set)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert listening.wait(20), "the server did not start"
        yield int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


_OPEN: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def connect(port: int) -> socket.socket:
    """A client socket, closed after the test."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _OPEN.append(sock)
    return sock


def http_client(port: int) -> http.client.HTTPConnection:
    """A keep-alive HTTP client, closed after the test."""
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    client.connect()
    assert client.sock is not None
    _OPEN.append(client.sock)
    return client


def read_until_closed(sock: socket.socket, limit_s: float = 10) -> bytes:
    """Everything the server sends until it closes the connection (bounded)."""
    sock.settimeout(limit_s)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def closed_after(sock: socket.socket) -> tuple[bytes, float]:
    began = time.monotonic()
    received = read_until_closed(sock)
    return received, time.monotonic() - began


def status_and_body(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def deposit_head(length: int) -> bytes:
    return (
        "POST /v1/accounts/u1/deposits HTTP/1.1\r\nHost: t\r\n"
        f"Authorization: Bearer {ADMIN_KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


# -- the head -------------------------------------------------------------------------------


def test_an_unfinished_head_is_closed_after_the_header_timeout(port: int) -> None:
    sock = connect(port)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")  # no blank line: never finished
    received, waited = closed_after(sock)
    assert received == b""
    assert HEAD_TIMEOUT_S * 0.8 <= waited < HEAD_TIMEOUT_S + 2


def test_a_connection_that_sends_nothing_is_closed_too(port: int) -> None:
    received, waited = closed_after(connect(port))
    assert received == b"" and waited < HEAD_TIMEOUT_S + 2


def test_a_head_trickled_a_byte_at_a_time_is_cut_off(port: int) -> None:
    """Bytes arriving keep no head alive: the timer runs from its first byte."""
    sock = connect(port)
    head = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    began = time.monotonic()
    sent = 0
    with pytest.raises(OSError):  # the server closes: a write or the read fails
        for byte in head:
            sock.sendall(bytes([byte]))
            sent += 1
            time.sleep(0.02)
            assert time.monotonic() - began < HEAD_TIMEOUT_S + 2, "never cut off"
        # The whole head went out (a fast machine is not that slow): the answer must say
        # the connection is gone instead.
        assert read_until_closed(sock) == b""
        raise OSError("closed")
    assert sent < len(head)


def test_many_unfinished_heads_are_all_closed(port: int) -> None:
    socks = [connect(port) for _ in range(300)]
    for sock in socks:
        sock.sendall(b"POST /v1/redpackets HTTP/1.1\r\nHost: t\r\n")
    deadline = time.monotonic() + HEAD_TIMEOUT_S + 5
    for sock in socks:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        assert sock.recv(1) == b""
        sock.close()


@pytest.mark.parametrize(
    "extra",
    [
        b"".join(b"X-H%d: v\r\n" % i for i in range(2000)),  # 2,000 headers
        b"X-Big: " + b"a" * 100_000 + b"\r\n",  # one 100 KB header
        b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 300) for i in range(60)),  # 60 x 300 B
    ],
    ids=["2000-headers", "100KB-header", "18KB-in-60-headers"],
)
def test_too_many_or_too_large_headers_are_431(port: int, extra: bytes) -> None:
    sock = connect(port)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + extra + b"\r\n")
    received = read_until_closed(sock)
    status, body = status_and_body(received)
    assert status == 431
    assert body["code"] == "headers_too_large" and body["status"] == 431
    assert b"content-type: application/problem+json" in received.lower()
    assert b"connection: close" in received.lower()


def test_a_head_just_under_the_limits_is_served(port: int) -> None:
    sock = connect(port)
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"c" * 100) for i in range(97))  # ~11 KiB
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + headers + b"\r\n")
    status, body = status_and_body(read_until_closed(sock))
    assert (status, body) == (200, {"status": "ok"})


# -- the body -------------------------------------------------------------------------------


def test_a_trickled_body_is_408_and_the_connection_closed(port: int) -> None:
    body = b'{"amount_cents": 700, "reference": "r1"}' + b" " * 60
    sock = connect(port)
    sock.sendall(deposit_head(len(body)))
    began = time.monotonic()
    answered = b""
    for byte in body:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            break
        sock.settimeout(0.05)
        try:
            answered = sock.recv(65536)
        except TimeoutError:
            continue
        break
    received = answered + read_until_closed(sock)
    waited = time.monotonic() - began
    status, problem = status_and_body(received)
    assert status == 408 and problem["code"] == "request_timeout"
    assert b"connection: close" in received.lower()
    assert BODY_TIMEOUT_S * 0.8 <= waited < BODY_TIMEOUT_S + 2
    # nothing was credited
    client = http_client(port)
    client.request("GET", "/v1/accounts/u1", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert json.loads(client.getresponse().read())["balance_cents"] == 0


# -- ordinary requests ----------------------------------------------------------------------


def test_ordinary_requests_and_keep_alive_are_untouched(port: int) -> None:
    """One connection, several requests, with pauses longer than the head timeout between
    them (the keep-alive pause is not a head's time) and bodies sent at once."""
    client = http_client(port)
    auth = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"}
    client.request("GET", "/healthz")
    assert client.getresponse().read() == b'{"status":"ok"}'
    first = client.sock
    for n in range(3):
        time.sleep(HEAD_TIMEOUT_S * 1.5)
        body = json.dumps({"amount_cents": 100, "reference": f"r{n}"})
        client.request("POST", "/v1/accounts/u1/deposits", body=body, headers=auth)
        answer = client.getresponse()
        assert answer.status == 201, answer.read()
        answer.read()
        assert client.sock is first  # the same connection, reused
    client.request("GET", "/v1/accounts/u1", headers=auth)
    assert json.loads(client.getresponse().read())["balance_cents"] == 300


# -- a client gone mid-body -------------------------------------------------------------------


def metric_count(port: int, route: str, status: int) -> float:
    client = http_client(port)
    client.request("GET", "/metrics")
    text = client.getresponse().read().decode()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("groupbuy_http_request_duration_seconds_count{")
            and f'route="{route}"' in line
            and f'status="{status}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_client_gone_mid_body_is_an_info_line_and_499_not_a_500(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    route = "/v1/accounts/{user_id}/deposits"
    before_499 = metric_count(port, route, 499)
    before_500 = metric_count(port, route, 500)
    caplog.set_level(logging.INFO)
    sock = connect(port)
    sock.sendall(deposit_head(1000) + b'{"amount_cents": 700, "reference": "r1", "x": "' + b"a" * 4)
    time.sleep(0.1)
    sock.close()
    deadline = time.monotonic() + 10
    while metric_count(port, route, 499) == before_499:
        assert time.monotonic() < deadline, "the request was never counted"
        time.sleep(0.05)
    assert metric_count(port, route, 499) == before_499 + 1
    assert metric_count(port, route, 500) == before_500
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
    closed = [r for r in caplog.records if "client closed the connection" in r.getMessage()]
    assert len(closed) == 1 and closed[0].levelno == logging.INFO
    access = [r.getMessage() for r in caplog.records if r.name == "groupbuy.access"]
    assert any(f"POST {route} 499" in line for line in access), access


def test_a_slow_body_times_out_alone(port: int) -> None:
    """While one body is late, the requests beside it (bodies sent at once) are served."""
    slow = connect(port)
    slow.sendall(deposit_head(100) + b'{"amount_cents": 5')
    client = http_client(port)
    auth = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"}
    began = time.monotonic()
    n = 0
    while time.monotonic() - began < BODY_TIMEOUT_S * 2:
        body = json.dumps({"amount_cents": 1, "reference": f"beside-{n}"})
        client.request("POST", "/v1/accounts/u2/deposits", body=body, headers=auth)
        answer = client.getresponse()
        assert answer.status == 201, answer.read()
        answer.read()
        n += 1
        time.sleep(0.05)
    status, problem = status_and_body(read_until_closed(slow))
    assert status == 408 and problem["code"] == "request_timeout"
    client.request("GET", "/v1/accounts/u2", headers=auth)
    assert json.loads(client.getresponse().read())["balance_cents"] == n
