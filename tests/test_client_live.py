"""groupbuy_client.client on its own wire (an aiohttp session) against a live `groupbuy serve` that
requires signed requests: one test per family of methods, each signed call accepted
(queries included: the target is signed as sent) and an unsigned one refused; and what a
request that gets no answer raises."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from groupbuy_client.client import GroupBuyAPIError, GroupBuyClient, GroupBuyTransportError
from groupbuy_client.client_sync import GroupBuySyncClient

from tests.support.http import ADMIN_KEY, SERVICE_KEY
from tests.support.receiver import Receiver, running_receiver
from tests.support.servers import free_port
from tests.support.service import Service, service_environment, start_service
from tests.support.settings import TEST_GUESS_LIMIT


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One signed-requests service for the module (its tests use distinct ids)."""
    directory = tmp_path_factory.mktemp("live")
    env = service_environment(
        directory,
        GROUPBUY_AUTH_SIGNED_REQUESTS="true",
        GROUPBUY_EMBEDDED_ENGINE="fakeredis",
        GROUPBUY_WEBHOOKS_ALLOW_HTTP="true",
        GROUPBUY_WEBHOOKS_ALLOW_PRIVATE_NETWORKS="true",
        # Each family's test sends an unsigned call on purpose: on a fast machine more than
        # the default 10 fall within the key-guessing window, and the next call is a 429.
        **TEST_GUESS_LIMIT,
    )
    service = start_service(directory, env=env)
    try:
        yield service
    finally:
        assert service.stop() == 0, service.text()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    yield from running_receiver()


@contextlib.asynccontextmanager
async def signed(live: Service) -> AsyncIterator[tuple[GroupBuyClient, GroupBuyClient]]:
    """An admin and a service client, both signing, on their own aiohttp sessions."""
    async with (
        GroupBuyClient(live.url, ADMIN_KEY, sign=True) as admin,
        GroupBuyClient(live.url, SERVICE_KEY, sign=True) as gb,
    ):
        yield admin, gb


async def refused_unsigned(live: Service, call: str, *args: Any, **kwargs: Any) -> None:
    """The same call from a client that does not sign: 401 bad_signature, reason missing."""
    async with GroupBuyClient(live.url, ADMIN_KEY) as unsigned:
        with pytest.raises(GroupBuyAPIError) as caught:
            await getattr(unsigned, call)(*args, **kwargs)
    assert (caught.value.status, caught.value.code) == (401, "bad_signature")
    assert caught.value.extra["reason"] == "missing"
    assert caught.value.headers["WWW-Authenticate"] == "Bearer"  # any case


async def test_health_readiness_metrics_and_the_document_need_no_signature(
    live: Service,
) -> None:
    async with GroupBuyClient(live.url, SERVICE_KEY, sign=True) as gb:
        assert await gb.health() == {"status": "ok"}
        assert (await gb.ready())["status"] == "ready"
        assert "groupbuy_http_request_duration_seconds" in await gb.metrics()
        assert "/v1/redpackets/{packet_id}/grab" in (await gb.openapi())["paths"]


async def test_activities(live: Service) -> None:
    async with signed(live) as (admin, gb):
        created = await admin.create_activity("act-1", name="One", team_size=2)
        assert await gb.get_activity("act-1") == created
        renamed = await admin.update_activity("act-1", name="Uno")
        assert renamed["name"] == "Uno"
        page = await gb.list_activities(status="open", limit=100)
        assert "act-1" in [a["activity_id"] for a in page["activities"]]
    await refused_unsigned(live, "list_activities", status="open", limit=100)


async def test_teams_and_seat_locks(live: Service) -> None:
    async with signed(live) as (admin, gb):
        await admin.create_activity("act-t", team_size=3)
        team = await gb.open_team("act-t", "L", team_id="t1", order_id="oL")
        assert (await gb.get_team("act-t", "t1"))["version"] == team["version"]
        assert (await gb.lock("act-t", "t1", "u1"))["status"] == "locked"
        assert (await gb.current_lock("act-t", "u1"))["team_id"] == "t1"
        assert (await gb.join("act-t", "u2"))["team_id"] == "t1"
        full = await gb.list_teams("act-t", has_free_seats=False, limit=5)
        assert [t["team_id"] for t in full["teams"]] == ["t1"]
        assert await gb.unlock("act-t", "t1", "u2") == {"released": True}
        assert (await gb.confirm("act-t", "t1", "u1", "o1"))["formed"] is False
        assert (await gb.list_teams("act-t", has_free_seats=True))["teams"][0]["team_id"] == "t1"
    await refused_unsigned(live, "list_teams", "act-t", has_free_seats=False)


async def test_accounts_and_red_packets(live: Service) -> None:
    async with signed(live) as (admin, gb):
        assert (await admin.deposit("alice", 1000, "ref-1"))["balance_cents"] == 1000
        await gb.send_packet("alice", 300, 3, packet_id="pk-1", strategy="equal")
        await gb.send_packet("alice", 100, 1, packet_id="pk-2")
        assert (await gb.grab("pk-1", "bob"))["amount_cents"] == 100
        assert (await gb.get_packet("pk-1"))["remaining_count"] == 2
        assert (await gb.account("alice"))["balance_cents"] == 600
        first = await gb.entries("alice", limit=1)
        assert first["next_cursor"] is not None
        rest = await gb.entries("alice", limit=5, cursor=first["next_cursor"])
        assert [e["kind"] for e in rest["entries"]] == ["send", "deposit"]
        page = await gb.list_packets(sender_id="alice", status="active", limit=1)
        more = await gb.list_packets(sender_id="alice", status="active", cursor=page["next_cursor"])
        assert [p["packet_id"] for p in page["packets"] + more["packets"]] == ["pk-2", "pk-1"]
    await refused_unsigned(live, "entries", "alice", limit=1)


async def test_a_password_packet_withdrawn_and_its_grabs(live: Service) -> None:
    async with signed(live) as (admin, gb):
        await admin.deposit("pia", 500, "ref-p")
        await gb.send_packet(
            "pia", 400, 4, packet_id="pk-p", strategy="equal", password="芝麻开门", message="hi"
        )
        with pytest.raises(GroupBuyAPIError) as caught:
            await gb.grab("pk-p", "bob", password="wrong")
        assert (caught.value.code, caught.value.extra["attempts_left"]) == ("wrong_password", 4)
        assert (await gb.grab("pk-p", "bob", password="芝麻开门"))["amount_cents"] == 100
        await gb.grab("pk-p", "cleo", password="芝麻开门")
        first = await gb.packet_grabs("pk-p", limit=1)
        rest = await gb.packet_grabs("pk-p", limit=1, cursor=first["next_cursor"])
        assert [g["user_id"] for g in first["grabs"] + rest["grabs"]] == ["bob", "cleo"]
        assert (await gb.packet_grab("pk-p", "cleo"))["user_id"] == "cleo"
        withdrawn = await gb.withdraw_packet("pk-p", "pia")
        assert (withdrawn["status"], withdrawn["refunded_cents"]) == ("withdrawn", 200)
        listed = await gb.list_packets(sender_id="pia", status="withdrawn")
        assert [p["packet_id"] for p in listed["packets"]] == ["pk-p"]
    await refused_unsigned(live, "packet_grabs", "pk-p", limit=1, cursor="1")


async def test_events_and_administration(live: Service) -> None:
    async with signed(live) as (admin, gb):
        await admin.deposit("carol", 500, "ref-c")
        await gb.send_packet("carol", 100, 1, packet_id="pk-e")
        page = await gb.events(after=0, limit=1000)
        assert "packet.sent" in [e["type"] for e in page["events"]]
        assert (await admin.run_job("flush_records"))["job"] == "flush_records"
        await admin.run_job("reconcile")
        assert (await admin.reconcile_report())["mismatch_count"] == 0
        assert (await admin.block_user("mallory", "fraud"))["reason"] == "fraud"
        assert [b["user_id"] for b in (await admin.blocked_users(limit=5))["blocked_users"]] == [
            "mallory"
        ]
        assert (await admin.unblock_user("mallory"))["unblocked"] is True
        assert (await admin.dead_letters(limit=5))["dead_letters"] == []
        with pytest.raises(GroupBuyAPIError) as caught:
            await admin.replay_dead_letter(1)
        assert caught.value.code == "not_found"
        actions = [e["action"] for e in (await admin.audit(limit=50))["entries"]]
        assert "user.block" in actions
    await refused_unsigned(live, "events", after=0, limit=5)


async def delivered(admin: GroupBuyClient, endpoint_id: str) -> list[int]:
    """The event ids of the endpoint's delivered deliveries, once there is one (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        page = await admin.webhook_deliveries(endpoint_id, status="delivered", limit=5)
        if page["deliveries"] or time.monotonic() > deadline:
            return [d["event_id"] for d in page["deliveries"]]
        await asyncio.sleep(0.05)


async def test_webhooks(live: Service, receiver: Receiver) -> None:
    async with signed(live) as (admin, gb):
        created = await admin.create_webhook("shop", receiver.url, ["packet.sent"])
        assert created["secret"]
        assert [w["endpoint_id"] for w in (await admin.webhooks(limit=5))["webhooks"]] == ["shop"]
        assert (await admin.get_webhook("shop"))["url"] == receiver.url
        changed = await admin.update_webhook("shop", description="the shop")
        assert changed["description"] == "the shop"
        rotated = await admin.rotate_webhook_secret("shop")
        assert rotated["secret"] != created["secret"]
        assert (await admin.test_webhook("shop"))["succeeded"] is True
        await admin.deposit("dora", 100, "ref-w")
        await gb.send_packet("dora", 100, 1, packet_id="pk-w")
        sent = [
            e
            for e in (await gb.events(after=0, limit=1000))["events"]
            if e["type"] == "packet.sent"
        ]
        assert await delivered(admin, "shop") == [sent[-1]["id"]]
        assert (await admin.replay_webhook("shop", after=0))["endpoint_id"] == "shop"
        assert await admin.delete_webhook("shop") == {"endpoint_id": "shop", "deleted": True}
    await refused_unsigned(live, "webhooks", limit=5)


def test_the_blocking_client_on_every_family(live: Service, receiver: Receiver) -> None:
    """GroupBuySyncClient (generated from the async one) signs each call as sent."""
    with (
        GroupBuySyncClient(live.url, ADMIN_KEY, sign=True) as admin,
        GroupBuySyncClient(live.url, SERVICE_KEY, sign=True) as gb,
        GroupBuySyncClient(live.url, SERVICE_KEY) as unsigned,
    ):
        assert gb.health() == {"status": "ok"} and gb.ready()["status"] == "ready"
        admin.create_activity("sync-a", team_size=2)
        assert gb.list_activities(status="open", limit=100)["activities"]
        gb.open_team("sync-a", "L", team_id="t1")
        assert gb.lock("sync-a", "t1", "u1")["status"] == "locked"
        assert gb.list_teams("sync-a", has_free_seats=False)["teams"][0]["team_id"] == "t1"
        assert gb.confirm("sync-a", "t1", "u1", "o1")["formed"] is True
        admin.deposit("sync-s", 200, "ref-s")
        gb.send_packet("sync-s", 200, 2, packet_id="pk-s")
        assert gb.grab("pk-s", "bob")["status"] == "grabbed"
        assert gb.packet_grabs("pk-s", limit=1)["grabs"] == [gb.packet_grab("pk-s", "bob")]
        assert gb.withdraw_packet("pk-s", "sync-s")["status"] == "withdrawn"
        assert [e["kind"] for e in gb.entries("sync-s", limit=5)["entries"]] == [
            "refund",
            "send",
            "deposit",
        ]
        assert gb.events(after=0, limit=1000)["events"]
        assert admin.block_user("sync-m")["user_id"] == "sync-m"
        assert admin.unblock_user("sync-m")["unblocked"] is True
        admin.create_webhook("sync-w", receiver.url, ["packet.sent"])
        assert admin.test_webhook("sync-w")["succeeded"] is True
        assert admin.delete_webhook("sync-w")["deleted"] is True
        with pytest.raises(GroupBuyAPIError) as caught:
            unsigned.list_teams("sync-a", has_free_seats=False)
        assert (caught.value.status, caught.value.code) == (401, "bad_signature")


# -- no answer -------------------------------------------------------------------------------


async def test_a_refused_connection_raises_the_transport_error() -> None:
    with socket.socket() as held:  # bound, not listening: connections to it are refused
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}"
        async with GroupBuyClient(url, SERVICE_KEY) as gb:
            with pytest.raises(GroupBuyTransportError) as caught:
                await gb.account("x")
    assert isinstance(caught.value.__cause__, aiohttp.ClientConnectionError)
    assert "GET /v1/accounts/x" in str(caught.value)


async def test_a_server_that_never_answers_raises_the_transport_error_after_the_timeout() -> None:
    received = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)  # closed by the test, never answered
        await reader.readline()
        received.set()

    port = free_port()
    server = await asyncio.start_server(silent, "127.0.0.1", port)
    try:
        async with GroupBuyClient(f"http://127.0.0.1:{port}", SERVICE_KEY, timeout_s=0.3) as gb:
            with pytest.raises(GroupBuyTransportError) as caught:
                await gb.grab("pk", "u")
        assert received.is_set()
        assert isinstance(caught.value.__cause__, TimeoutError)
    finally:
        server.close()
        for writer in writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await server.wait_closed()


async def test_a_failing_httpx_transport_raises_the_transport_error() -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    transport = httpx.MockTransport(fail)
    async with GroupBuyClient("http://x", SERVICE_KEY, transport=transport) as gb:
        with pytest.raises(GroupBuyTransportError) as caught:
            await gb.health()
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


def test_the_module_needs_no_httpx_without_a_transport(tmp_path: Path) -> None:
    """Callers on the network need aiohttp and orjson, not httpx."""
    probe = (
        "import sys; sys.modules['httpx'] = None\n"
        "import groupbuy_client.client as c\n"
        "c.GroupBuyClient('http://127.0.0.1:1', 'k')\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr
