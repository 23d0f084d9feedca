"""groupbuy_client.client_sync: generated from the async client (one definition of the API), with
the same methods, parameters and answers; its requests through an httpx transport."""

from __future__ import annotations

import inspect
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from groupbuy_client.client import GroupBuyAPIError, GroupBuyClient, GroupBuyTransportError
from groupbuy_client.client_sync import GroupBuySyncClient
from groupbuy_client.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature

from tests.support.http import SERVICE_KEY

REPO = Path(__file__).resolve().parents[1]


def test_the_blocking_client_is_what_the_generator_writes() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/unasync_client.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_")
    }


def test_both_clients_have_the_same_methods_parameters_and_answers() -> None:
    async_methods = public_methods(GroupBuyClient)
    sync_methods = public_methods(GroupBuySyncClient)
    assert set(sync_methods) == (set(async_methods) - {"aclose"}) | {"close"}
    assert len(async_methods) > 40
    for name, signature_ in async_methods.items():
        if name != "aclose":
            assert sync_methods[name] == signature_, name
        assert inspect.iscoroutinefunction(getattr(GroupBuyClient, name)), name
        blocking = "close" if name == "aclose" else name
        assert not inspect.iscoroutinefunction(getattr(GroupBuySyncClient, blocking)), name


def test_requests_are_built_and_signed_as_the_async_client_builds_them() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/teams"):
            return httpx.Response(200, json={"teams": [], "next_cursor": None})
        return httpx.Response(
            409,
            json={"code": "team_full", "title": "Full", "detail": "d", "next_unlock_at": "t"},
            headers={"Content-Type": "application/problem+json"},
        )

    transport = httpx.MockTransport(answer)
    with GroupBuySyncClient("http://x", SERVICE_KEY, sign=True, transport=transport) as gb:
        assert gb.list_teams("a1", has_free_seats=False, limit=5)["teams"] == []
        with pytest.raises(GroupBuyAPIError) as caught:
            gb.lock("a1", "t1", "u1")
    assert (caught.value.status, caught.value.extra) == (409, {"next_unlock_at": "t"})
    listing, lock = seen
    assert listing.url.raw_path == b"/v1/activities/a1/teams?has_free_seats=false&limit=5"
    assert (lock.method, lock.content) == ("POST", b'{"user_id":"u1"}')
    for request in seen:
        expected = signature(
            SERVICE_KEY,
            request.method,
            request.url.raw_path,
            request.headers[TIMESTAMP_HEADER],
            request.content,
        )
        assert request.headers[SIGNATURE_HEADER] == expected
        assert request.headers["Authorization"] == f"Bearer {SERVICE_KEY}"


def test_packet_requests_carry_their_terms_cursors_and_passwords() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    transport = httpx.MockTransport(answer)
    with GroupBuySyncClient("http://x", SERVICE_KEY, transport=transport) as gb:
        gb.send_packet(
            "alice", 300, 3, message="hi", recipients=["bob"], password="pw", sender_may_grab=False
        )
        gb.send_packet("alice", 100, 1)
        gb.grab("pk", "bob", password="pw")
        gb.grab("pk", "bob")
        gb.withdraw_packet("pk", "alice")
        gb.packet_grabs("pk", limit=1, cursor="100")
        gb.packet_grab("pk", "bob")
        gb.list_packets(status="withdrawn")
    assert [(r.method, r.url.raw_path, r.content) for r in seen] == [
        (
            "POST",
            b"/v1/redpackets",
            b'{"sender_id":"alice","amount_cents":300,"count":3,"message":"hi",'
            b'"recipients":["bob"],"password":"pw","sender_may_grab":false}',
        ),
        ("POST", b"/v1/redpackets", b'{"sender_id":"alice","amount_cents":100,"count":1}'),
        ("POST", b"/v1/redpackets/pk/grab", b'{"user_id":"bob","password":"pw"}'),
        ("POST", b"/v1/redpackets/pk/grab", b'{"user_id":"bob"}'),
        ("POST", b"/v1/redpackets/pk/withdraw", b'{"sender_id":"alice"}'),
        ("GET", b"/v1/redpackets/pk/grabs?limit=1&cursor=100", b""),
        ("GET", b"/v1/redpackets/pk/grabs/bob", b""),
        ("GET", b"/v1/redpackets?status=withdrawn", b""),
    ]


def test_a_refused_connection_raises_the_transport_error() -> None:
    with socket.socket() as held:  # bound, not listening: connections to it are refused
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}"
        with (
            GroupBuySyncClient(url, SERVICE_KEY) as gb,
            pytest.raises(GroupBuyTransportError) as caught,
        ):
            gb.health()
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
