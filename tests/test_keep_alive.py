"""`[server] keep_alive_s` reaches the server `groupbuy serve` runs, with one worker and
with several: an idle connection stays open that long, then the server closes it.

Why it matters: uvicorn's own default (5 s) equals httpx's idle expiry, so a client could
send on a connection at the moment the server closed it and get no answer ("Server
disconnected without sending a response", seen in a storm test). The default, 75 s, is
above the idle timeouts of the usual clients and proxies."""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.service import service_environment, start_service

pytestmark = pytest.mark.slow  # each test starts `groupbuy serve`


def _idle_connection(url: str) -> http.client.HTTPConnection:
    """A connection that has had one answer and is now idle (keep-alive)."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=5)
    connection.request("GET", "/healthz")
    response = connection.getresponse()
    response.read()
    assert response.status == 200 and not response.will_close
    return connection


def _closed_by_server(connection: http.client.HTTPConnection, within_s: float) -> bool:
    """Whether the server closes the idle connection within `within_s`."""
    sock = connection.sock
    assert sock is not None
    readable, _, _ = select.select([sock], [], [], within_s)
    return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_idle_connection_is_closed_after_keep_alive_s(tmp_path: Path, workers: str) -> None:
    env = service_environment(tmp_path, GROUPBUY_SERVER_KEEP_ALIVE_S="1")
    service = start_service(tmp_path, "--workers", workers, env=env)
    try:
        with contextlib.closing(_idle_connection(service.url)) as connection:
            idle_from = time.monotonic()
            # Closed after 1 s, well before uvicorn's default of 5 s would close it.
            assert _closed_by_server(connection, within_s=3.5)
            assert time.monotonic() - idle_from >= 0.9
    finally:
        service.stop()


def test_by_default_an_idle_connection_outlasts_the_usual_client_expiry(tmp_path: Path) -> None:
    service = start_service(tmp_path)
    try:
        with contextlib.closing(_idle_connection(service.url)) as connection:
            # Past httpx's 5 s idle expiry (uvicorn's default would have closed it by then).
            assert not _closed_by_server(connection, within_s=6.5)
    finally:
        service.stop()
