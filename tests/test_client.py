"""groupbuy_client.client end to end: every method against the in-process app (httpx's
ASGITransport, lifespan running), unsigned and signed, on fakeredis and a real
redis-server; once against a live `groupbuy serve`."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import subprocess
import time
import typing
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from groupbuy_client import wire
from groupbuy_client.client import GroupBuyAPIError, GroupBuyClient
from groupbuy_client.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER
from starlette.applications import Starlette

from groupbuy.api import answers
from groupbuy.api.app import create_app
from groupbuy.settings import Settings
from tests.support.client_venv import client_python
from tests.support.http import ADMIN_KEY, SERVICE_KEY, ms
from tests.support.service import service_environment, start_service
from tests.support.snippets import python_walk_through

BASE = "http://groupbuy.test"


@dataclass
class Clients:
    """An admin and a service client of one app, signing or not."""

    app: Starlette
    admin: GroupBuyClient
    service: GroupBuyClient
    signed: bool


@contextlib.asynccontextmanager
async def serving(settings: Settings, signed: bool) -> AsyncIterator[Clients]:
    """The app (signed requests required when the clients sign) and its two clients."""
    app = create_app(settings.replace("auth", signed_requests=signed))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with (
            GroupBuyClient(BASE, ADMIN_KEY, sign=signed, transport=transport) as admin,
            GroupBuyClient(BASE, SERVICE_KEY, sign=signed, transport=transport) as service,
        ):
            yield Clients(app, admin, service, signed)


@pytest.fixture(params=[False, True], ids=["unsigned", "signed"])
async def clients(settings: Settings, request: pytest.FixtureRequest) -> AsyncIterator[Clients]:
    """Both clients of an app, signing and requiring signatures or neither."""
    async with serving(settings, bool(request.param)) as both:
        yield both


@pytest.fixture
async def signed_clients(settings: Settings) -> AsyncIterator[Clients]:
    """Both clients of an app that requires signed requests, signing."""
    async with serving(settings, True) as both:
        yield both


async def raises(code: str, status: int, call: typing.Awaitable[Any]) -> GroupBuyAPIError:
    """Await `call`, which must raise the API error `code` with `status`; return it."""
    with pytest.raises(GroupBuyAPIError) as caught:
        await call
    error = caught.value
    assert (error.status, error.code) == (status, code), error.problem
    assert error.problem["code"] == code and error.detail and error.title
    return error


async def test_operations_and_unauthenticated_routes(clients: Clients) -> None:
    gb = clients.service
    assert await gb.health() == {"status": "ok"}
    ready = await gb.ready()
    assert ready["status"] == "ready" and set(ready["checks"]) == {"redis", "scripts", "database"}
    assert "groupbuy_http_request_duration_seconds" in await gb.metrics()
    assert "/v1/redpackets/{packet_id}/grab" in (await gb.openapi())["paths"]


async def test_activities_teams_and_locks(clients: Clients) -> None:
    admin, gb = clients.admin, clients.service
    activity = await admin.create_activity(
        "a1",
        name="Spring",
        team_size=3,
        lock_ttl_s=300,
        team_deadline_s=3600,
        virtual_min_members=2,
        teams_per_user=5,
        open_teams_per_leader=2,
    )
    assert activity["activity_id"] == "a1" and activity["team_size"] == 3
    assert activity["virtual_completion"] == {"min_members": 2}
    assert activity["limits"] == {"teams_per_user": 5, "open_teams_per_leader": 2}
    assert (
        await admin.create_activity(
            "a1",
            name="Spring",
            team_size=3,
            lock_ttl_s=300,
            team_deadline_s=3600,
            virtual_min_members=2,
            teams_per_user=5,
            open_teams_per_leader=2,
        )
        == activity
    )
    conflict = await raises("conflict", 409, admin.create_activity("a1", team_size=4))
    assert conflict.extra["activity"]["team_size"] == 3
    await raises("forbidden", 403, gb.create_activity("a2"))
    assert await gb.get_activity("a1") == activity
    await raises("activity_not_found", 404, gb.get_activity("nope"))

    team = await gb.open_team("a1", "L", team_id="t1", order_id="oL")
    assert (team["team_id"], team["status"], team["free_seats"]) == ("t1", "open", 2)
    assert [m["user_id"] for m in team["members"]] == ["L"]
    named = await gb.open_team("a1", "M")
    assert named["team_id"] and named["leader_id"] == "M"
    assert (await gb.get_team("a1", "t1"))["version"] == team["version"]

    locked = await gb.lock("a1", "t1", "u1")
    assert locked["status"] == "locked" and "existing" not in locked
    assert ms(locked["expires_at"]) - ms(locked["locked_at"]) == 300_000
    again = await gb.lock("a1", "t1", "u1")
    assert again.get("existing") is True and again["locked_at"] == locked["locked_at"]
    current = await gb.current_lock("a1", "u1")
    assert current == {k: locked[k] for k in ("team_id", "locked_at", "expires_at")}
    await raises("no_lock", 404, gb.current_lock("a1", "nobody"))
    assert await gb.extend("a1", "t1", "u1", 300) == locked  # max_hold_s: lock_ttl_s
    await raises("invalid_request", 422, gb.extend("a1", "t1", "u1", 301))

    page = await gb.list_teams("a1", limit=10)
    assert [t["team_id"] for t in page["teams"]] == ["t1", named["team_id"]]
    first = await gb.list_teams("a1", limit=1)
    assert first["next_cursor"] is not None
    rest = await gb.list_teams("a1", limit=1, cursor=first["next_cursor"])
    assert [t["team_id"] for t in rest["teams"]] == [named["team_id"]]

    joined = await gb.join("a1", "u2")
    assert joined["team_id"] == "t1"  # the most taken seats first
    full = await raises("team_full", 409, gb.lock("a1", "t1", "u3"))
    assert full.extra["next_unlock_at"] is not None

    confirmed = await gb.confirm("a1", "t1", "u1", "o1")
    assert confirmed["formed"] is False
    assert [m["user_id"] for m in confirmed["team"]["members"]] == ["L", "u1"]
    assert await gb.confirm("a1", "t1", "u1", "o1") == confirmed
    await raises("lock_required", 409, gb.confirm("a1", "t1", "u3", "o3"))
    assert await gb.unlock("a1", "t1", "u2") == {"released": True}
    assert await gb.unlock("a1", "t1", "u2") == {"released": False}
    await raises("invalid_request", 422, gb.get_team("a1", "a/b"))

    await gb.lock("a1", "t1", "u2")
    await gb.confirm("a1", "t1", "u2", "o2")  # t1 formed
    formed = await gb.list_teams("a1", status="formed")
    assert [t["team_id"] for t in formed["teams"]] == ["t1"]
    assert (await gb.list_teams("a1", has_free_seats=False))["teams"] == []
    await raises("invalid_request", 422, gb.list_teams("a1", status="failed", has_free_seats=True))

    listed = await gb.list_activities(status="open", limit=1)
    assert [a["activity_id"] for a in listed["activities"]] == ["a1"]
    await raises("forbidden", 403, gb.update_activity("a1", close=True))
    closed = await admin.update_activity("a1", name="Spring!", close=True)
    # Live counts: t1 formed (L, u1, u2), the team of M open; no lock is left.
    counts = {"teams_open": 1, "teams_formed": 1, "members": 4, "live_locks": 0}
    assert closed == {**activity, "name": "Spring!", "status": "closed", **counts}
    assert (await gb.list_activities(status="closed"))["activities"] == [closed]
    await raises("activity_closed", 409, gb.join("a1", "u7"))


async def test_an_activity_s_sale_through_the_client(clients: Clients) -> None:
    admin, gb = clients.admin, clients.service
    sale = await admin.create_activity(
        "s1", starts_at="2999-01-01T00:00:00Z", stock=2, max_hold_s=600, late_confirm=True
    )
    assert (sale["status"], sale["starts_at"], sale["stock_left"]) == (
        "scheduled",
        "2999-01-01T00:00:00.000Z",
        2,
    )
    assert (sale["max_hold_s"], sale["late_confirm"]) == (600, True)
    refused = await raises("activity_not_started", 409, gb.open_team("s1", "L"))
    assert refused.extra["starts_at"] == "2999-01-01T00:00:00.000Z"
    changed = await admin.update_activity("s1", ends_at="3000-01-01T00:00:00Z", stock=5)
    assert (changed["ends_at"], changed["stock"]) == ("3000-01-01T00:00:00.000Z", 5)
    await raises("invalid_request", 422, admin.update_activity("s1", stock=0))


async def test_leave_refund_and_dissolve_through_the_client(clients: Clients) -> None:
    admin, gb = clients.admin, clients.service
    await admin.create_activity("r1", team_size=2)
    await gb.open_team("r1", "L", team_id="t1", order_id="oL")
    await gb.lock("r1", "t1", "u1")
    await gb.confirm("r1", "t1", "u1", "o1")  # formed
    refunded = await gb.leave("r1", "t1", "u1", order_id="o1", reason="refund")
    assert refunded["refunded"] is True and "refunded_at" in refunded["team"]["members"][1]
    await raises("order_mismatch", 409, gb.leave("r1", "t1", "u1"))
    await gb.open_team("r1", "L2", team_id="t2")
    left = await gb.leave("r1", "t2", "L2")
    assert left["left"] is True and left["team"]["status"] == "failed"  # abandoned
    await gb.open_team("r1", "L3", team_id="t3")
    dissolved = await admin.dissolve_team("r1", "t3", "scalpers")
    assert dissolved["dissolved"] is True and dissolved["team"]["status"] == "failed"
    await raises("forbidden", 403, gb.dissolve_team("r1", "t3", "no"))


async def test_accounts_packets_events_and_jobs(clients: Clients) -> None:
    admin, gb = clients.admin, clients.service
    assert await admin.deposit("alice", 1000, "ref-1") == {
        "user_id": "alice",
        "balance_cents": 1000,
    }
    assert await admin.deposit("alice", 1000, "ref-1") == {
        "user_id": "alice",
        "balance_cents": 1000,
    }
    await raises("conflict", 409, admin.deposit("alice", 999, "ref-1"))
    assert (await gb.account("alice"))["balance_cents"] == 1000
    await raises("insufficient_funds", 409, gb.send_packet("bob", 5000, 2))

    sent = await gb.send_packet(
        "alice", 600, 3, packet_id="pk-1", expires_in_s=600, strategy="equal"
    )
    assert (sent["packet_id"], sent["status"], sent["strategy"]) == ("pk-1", "active", "equal")
    grabbed = await gb.grab("pk-1", "bob")
    assert grabbed == {"status": "grabbed", "amount_cents": 200, "remaining_count": 2}
    assert await gb.grab("pk-1", "bob") == {"status": "already_grabbed", "amount_cents": 200}
    packet = await gb.get_packet("pk-1")
    assert [(g["user_id"], g["amount_cents"]) for g in packet["grabs"]] == [("bob", 200)]
    assert packet["remaining_cents"] == 400 and packet["version"] >= 2
    await raises("packet_not_found", 404, gb.get_packet("nope"))
    auto = await gb.send_packet("alice", 100, 1)
    assert auto["packet_id"] and auto["strategy"] == "double_mean"

    flushed = await admin.run_job("flush_records")
    assert flushed["job"] == "flush_records" and flushed["duration_ms"] >= 0
    await raises("not_found", 404, admin.run_job("nope"))
    await raises("forbidden", 403, gb.run_job("flush_records"))
    await raises("not_found", 404, admin.reconcile_report())
    await admin.run_job("reconcile")
    report = await admin.reconcile_report()
    assert report["mismatch_count"] == 0 and report["packets_checked"] >= 1, report

    page = await gb.events(after=0, limit=1000)
    types = [event["type"] for event in page["events"]]
    assert "packet.sent" in types and page["next_after"] == page["events"][-1]["id"]
    later = await gb.events(after=page["events"][0]["id"], limit=1)
    assert [event["id"] for event in later["events"]] == [page["events"][1]["id"]]
    await raises("invalid_request", 422, gb.events(limit=0))


async def test_a_packet_s_terms_withdrawal_and_its_grabs(clients: Clients) -> None:
    admin, gb = clients.admin, clients.service
    await admin.deposit("alice", 1000, "ref-t")
    sent = await gb.send_packet(
        "alice",
        300,
        3,
        packet_id="pk-t",
        strategy="equal",
        message="恭喜发财",
        recipients=["bob", "carol", "dave"],
        password="open sesame",
        sender_may_grab=False,
    )
    assert sent["message"] == "恭喜发财" and len(sent["shares_sha256"] or "") == 64
    wrong = await raises("wrong_password", 403, gb.grab("pk-t", "bob", password="nope"))
    assert wrong.extra["attempts_left"] == 4
    await raises("wrong_password", 403, gb.grab("pk-t", "bob"))
    await raises("not_a_recipient", 403, gb.grab("pk-t", "erin", password="open sesame"))
    assert (await gb.grab("pk-t", "bob", password="open sesame"))["amount_cents"] == 100
    await gb.grab("pk-t", "carol", password="open sesame")
    packet = await gb.get_packet("pk-t")
    assert (packet["recipients_count"], packet["password_protected"]) == (3, True)
    assert "open sesame" not in str(packet)

    first = await gb.packet_grabs("pk-t", limit=1)
    assert [g["user_id"] for g in first["grabs"]] == ["bob"] and first["next_cursor"]
    rest = await gb.packet_grabs("pk-t", cursor=first["next_cursor"])
    assert [g["user_id"] for g in rest["grabs"]] == ["carol"] and rest["next_cursor"] is None
    assert (await gb.packet_grab("pk-t", "carol"))["amount_cents"] == 100
    await raises("not_grabbed", 404, gb.packet_grab("pk-t", "dave"))
    await raises("invalid_request", 422, gb.packet_grabs("pk-t", cursor="x"))

    await raises("not_the_sender", 403, gb.withdraw_packet("pk-t", "bob"))
    withdrawn = await gb.withdraw_packet("pk-t", "alice")
    assert (withdrawn["status"], withdrawn["refunded_cents"]) == ("withdrawn", 100)
    assert withdrawn["salt"] and withdrawn["shares"] == [100, 100, 100]
    assert (await gb.withdraw_packet("pk-t", "alice"))["refunded_cents"] == 100
    assert (await gb.account("alice"))["balance_cents"] == 800
    await raises("withdrawn", 410, gb.grab("pk-t", "dave", password="open sesame"))
    listed = await gb.list_packets(status="withdrawn")
    assert [p["packet_id"] for p in listed["packets"]] == ["pk-t"]


async def test_blocked_users(clients: Clients) -> None:
    admin, gb = clients.admin, clients.service
    await admin.deposit("mallory", 1000, "ref-m")
    blocked = await admin.block_user("mallory", "chargebacks")
    assert (blocked["user_id"], blocked["reason"]) == ("mallory", "chargebacks")
    assert (await admin.block_user("zed"))["reason"] is None
    await raises("forbidden", 403, gb.block_user("eve"))
    await raises("user_blocked", 403, gb.send_packet("mallory", 100, 1))
    first = await admin.blocked_users(limit=1)
    assert [entry["user_id"] for entry in first["blocked_users"]] == ["mallory"]
    rest = await admin.blocked_users(limit=1, cursor=first["next_cursor"])
    assert [entry["user_id"] for entry in rest["blocked_users"]] == ["zed"]
    assert await admin.unblock_user("mallory") == {"user_id": "mallory", "unblocked": True}
    assert await admin.unblock_user("mallory") == {"user_id": "mallory", "unblocked": False}
    assert (await gb.send_packet("mallory", 100, 1))["status"] == "active"


async def test_dead_letters(clients: Clients) -> None:
    admin, gb = clients.admin, clients.service
    await admin.deposit("alice", 1000, "ref-d")
    await gb.send_packet("alice", 300, 3, packet_id="pk-d")
    await gb.grab("pk-d", "bob")  # the packet now has records waiting for the writer
    services = clients.app.state.services
    entry_id = await services.redis.xadd(
        services.keys.packet_outbox("pk-d"), {"type": "nonsense", "packet_id": "pk-d"}
    )
    await admin.run_job("flush_records")
    await raises("forbidden", 403, gb.dead_letters())
    page = await admin.dead_letters(limit=10)
    [letter] = page["dead_letters"]
    assert (letter["entry_id"], letter["owner_id"], letter["replayed_at"]) == (
        str(entry_id),
        "pk-d",
        None,
    )
    assert page["next_cursor"] is None
    await raises("replay_failed", 409, admin.replay_dead_letter(letter["id"]))
    await raises("not_found", 404, admin.replay_dead_letter(letter["id"] + 1))


async def test_the_same_request_twice_in_a_second_is_answered_twice(clients: Clients) -> None:
    """Equal requests signed in one second would share a signature; the client moves the
    second one's timestamp on so the server does not take it for a replay."""
    for _ in range(5):
        assert await clients.service.account("carol") == {"user_id": "carol", "balance_cents": 0}


async def test_two_clients_sending_one_request_in_the_same_second_are_both_answered(
    signed_clients: Clients,
) -> None:
    """Two processes of a backend with one key may ask the same thing in the same second:
    the second signature is the first one again, refused as `replayed`; its client signs
    again with a later timestamp and is answered."""
    second = int(time.time())
    transport = httpx.ASGITransport(app=signed_clients.app)
    async with (
        GroupBuyClient(
            BASE, SERVICE_KEY, sign=True, transport=transport, clock=lambda: second
        ) as a,
        GroupBuyClient(
            BASE, SERVICE_KEY, sign=True, transport=transport, clock=lambda: second
        ) as b,
    ):
        for client in (a, b, a, b):
            assert await client.account("dora") == {"user_id": "dora", "balance_cents": 0}


async def test_a_client_that_does_not_sign_is_refused_where_signing_is_required(
    clients: Clients,
) -> None:
    transport = httpx.ASGITransport(app=clients.app)
    async with GroupBuyClient(BASE, SERVICE_KEY, transport=transport) as unsigned:
        assert await unsigned.health() == {"status": "ok"}  # no key, no signature needed
        if clients.signed:
            error = await raises("bad_signature", 401, unsigned.account("x"))
            assert error.headers["www-authenticate"] == "Bearer"
        else:
            assert (await unsigned.account("x"))["balance_cents"] == 0
    async with GroupBuyClient(BASE, "wrong", sign=True, transport=transport) as stranger:
        await raises("unauthorized", 401, stranger.account("x"))


async def test_one_of_racing_copies_of_a_signed_request_wins(signed_clients: Clients) -> None:
    """Replays sent at the same instant as the original: Redis's SET NX lets one through."""
    clients = signed_clients
    await clients.admin.create_activity("a1")
    await clients.service.open_team("a1", "L", team_id="t1")
    captured: list[httpx.Request] = []

    async def capture(request: httpx.Request) -> httpx.Response:
        captured.append(request)
        return httpx.Response(200, json={})

    async with GroupBuyClient(
        BASE, SERVICE_KEY, sign=True, transport=httpx.MockTransport(capture)
    ) as recorder:
        await recorder.lock("a1", "t1", "u1")
    (original,) = captured
    assert {TIMESTAMP_HEADER.lower(), SIGNATURE_HEADER.lower()} <= set(original.headers)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=clients.app), base_url=BASE
    ) as raw:
        copies = [
            raw.post(original.url.path, content=original.content, headers=original.headers)
            for _ in range(8)
        ]
        answers_ = await asyncio.gather(*copies)
    statuses = sorted(answer.status_code for answer in answers_)
    assert statuses == [201] + [401] * 7, [answer.text for answer in answers_]
    assert all(
        answer.json()["code"] == "bad_signature" for answer in answers_ if answer.status_code == 401
    )


# -- the typed answers are the documented ones ---------------------------------------------

REPO = Path(__file__).resolve().parents[1]
GROUPBUY = REPO / "groupbuy"
CLIENT = REPO / "client" / "groupbuy_client"
CLIENT_MODULES = ("client.py", "client_sync.py")


def test_every_answer_of_the_client_is_a_shape_of_wire() -> None:
    """The client's TypedDicts are the server's own (the OpenAPI document is built from
    them); the methods that answer no JSON object are the exceptions listed."""
    shapes = list(vars(wire).values())
    others = {"metrics": str, "openapi": dict[str, Any], "aclose": type(None)}
    for name, method in vars(GroupBuyClient).items():
        if name.startswith("_") or not callable(method):
            continue
        answer = typing.get_type_hints(method, include_extras=True)["return"]
        if name in others:
            assert answer == others[name], name
        else:
            assert any(answer is shape for shape in shapes), (name, answer)
            answers.model(answer)  # documented: the OpenAPI document has its model


def _classes(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def test_no_class_is_defined_in_both_the_client_and_the_server() -> None:
    """The server defines none of the client's classes again: it imports what it shares."""
    client = set().union(*(_classes(CLIENT / name) for name in CLIENT_MODULES))
    assert {"GroupBuyClient", "GroupBuySyncClient"} <= client
    server: set[str] = set()
    for path in GROUPBUY.rglob("*.py"):
        server |= _classes(path)
    assert len(server) > 100
    assert client & server == set()


# -- a live service --------------------------------------------------------------------------


def _without_pythonpath(env: dict[str, str]) -> dict[str, str]:
    """`env` less PYTHONPATH, which could lend the clean virtualenv the server's modules."""
    return {name: value for name, value in env.items() if name != "PYTHONPATH"}


async def test_a_live_service_with_signed_requests(tmp_path: Path) -> None:
    env = service_environment(
        tmp_path, GROUPBUY_AUTH_SIGNED_REQUESTS="true", GROUPBUY_EMBEDDED_ENGINE="fakeredis"
    )
    python = client_python()  # groupbuy-client installed alone: nothing of the server
    service = await asyncio.to_thread(start_service, tmp_path, env=env)
    try:
        async with (
            GroupBuyClient(service.url, ADMIN_KEY, sign=True) as admin,
            GroupBuyClient(service.url, SERVICE_KEY, sign=True) as gb,
            GroupBuyClient(service.url, SERVICE_KEY) as unsigned,
        ):
            await admin.create_activity("live")
            await gb.open_team("live", "L", team_id="t1")
            assert (await gb.lock("live", "t1", "u1"))["status"] == "locked"
            assert (await gb.list_teams("live", limit=5))["teams"][0]["team_id"] == "t1"
            await raises("bad_signature", 401, unsigned.get_team("live", "t1"))
        # The Python walk-through of docs/getting-started.md, as it is written there, run
        # where only groupbuy-client is installed.
        walk = await asyncio.to_thread(
            subprocess.run,
            [str(python), "-c", python_walk_through()[0]],
            env={**_without_pythonpath(env), "URL": service.url, "GROUPBUY_KEY": ADMIN_KEY},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert walk.returncode == 0, walk.stderr
        assert "carol holds a seat in py-team-1" in walk.stdout, walk.stdout
        assert "team_full - next seat may free at" in walk.stdout, walk.stdout
        assert "packet.sent" in walk.stdout, walk.stdout
        assert "signed requests: required of every key" in service.text()
    finally:
        assert service.stop() == 0, service.text()


async def test_repeats_of_one_request_take_the_next_seconds_and_old_stamps_are_forgotten() -> None:
    now = [1_700_000_000.0]
    stamps: list[str] = []

    async def record(request: httpx.Request) -> httpx.Response:
        stamps.append(request.headers[TIMESTAMP_HEADER])
        return httpx.Response(200, json={"user_id": "x", "balance_cents": 0})

    transport = httpx.MockTransport(record)
    async with GroupBuyClient(
        BASE, SERVICE_KEY, sign=True, transport=transport, clock=lambda: now[0]
    ) as gb:
        for _ in range(3):
            await gb.account("x")
        await gb.account("y")
        assert stamps == ["1700000000", "1700000001", "1700000002", "1700000000"]
        # Within one second the stamps are not sifted again on every request (that cost
        # grew with the number of requests made in the second).
        tables = set()
        for n in range(2000):
            await gb.account(f"u{n}")
            tables.add(id(gb._last_stamps))
        assert len(tables) == 1
        now[0] += 5
        await gb.account("x")
        assert stamps[-1] == "1700000005"
        # Only the stamps that could still collide are kept: the one just made.
        assert len(gb._last_stamps) == 1


async def test_listings_entries_and_the_audit_log(clients: Clients) -> None:
    admin, gb = clients.admin, clients.service
    await admin.deposit("alice", 1000, "ref-a")
    await gb.send_packet("alice", 300, 3, packet_id="pk-a", strategy="equal")
    await gb.send_packet("alice", 100, 1, packet_id="pk-b")
    await gb.grab("pk-b", "bob")
    first = await gb.list_packets(sender_id="alice", limit=1)
    assert [p["packet_id"] for p in first["packets"]] == ["pk-b"]
    rest = await gb.list_packets(sender_id="alice", cursor=first["next_cursor"])
    assert [p["packet_id"] for p in rest["packets"]] == ["pk-a"] and rest["next_cursor"] is None
    assert [p["packet_id"] for p in (await gb.list_packets(status="active"))["packets"]] == ["pk-a"]
    await raises("invalid_request", 422, gb.list_packets(limit=0))
    page = await gb.entries("alice", limit=2)
    assert [(e["kind"], e["balance_after_cents"]) for e in page["entries"]] == [
        ("send", 600),
        ("send", 700),
    ]
    older = await gb.entries("alice", cursor=page["next_cursor"])
    assert [(e["kind"], e["reference"]) for e in older["entries"]] == [("deposit", "ref-a")]
    audit = await admin.audit(limit=10)
    assert [(e["action"], e["target"]) for e in audit["entries"]] == [("account.deposit", "alice")]
    await raises("forbidden", 403, gb.audit())
