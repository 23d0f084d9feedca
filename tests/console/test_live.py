"""Live updates: the server-sent-events stream of each page, its JSON twin, the cap on
streams, and streams ending on disconnect and on shutdown."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette

from groupbuy.api.app import create_app
from groupbuy.console import streams
from groupbuy.settings import Settings
from tests.support.console import console_context, csrf_of
from tests.support.http import ADMIN, ADMIN_KEY, SERVICE

BASE = "http://testserver"
WAIT_S = 10.0  # bound on waiting for a stream to do what it must


async def _signed_in(client: httpx.AsyncClient) -> None:
    form = await client.get("/console/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    signed = await client.post(
        "/console/signin", data={"key": ADMIN_KEY, "csrf": csrf.group(1), "next": "/console"}
    )
    assert signed.status_code == 303, signed.text


@pytest.fixture
async def served(settings: Settings) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """The app (one live stream allowed) with its lifespan running, and a signed-in client."""
    app = create_app(settings.replace("console", live_connections=1))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            yield app, client


def _messages(body: str) -> list[dict[str, Any]]:
    """The updates of a stream: its unnamed events (`end` and `trouble` are named)."""
    blocks = [block.split("\n") for block in body.split("\n\n") if block]
    named = [block for block in blocks if block[0].startswith("event: ")]
    assert all(block[0] == "event: end" for block in named), named
    return [
        orjson.loads(block[0][len("data: ") :]) for block in blocks if block[0].startswith("data: ")
    ]


async def test_the_overview_stream_pushes_its_numbers_and_ends(
    served: tuple[Starlette, httpx.AsyncClient],
) -> None:
    _app, client = served
    await _signed_in(client)
    # The stream lasts [console] live_stream_s (0.3 s here) at 0.05 s per update.
    answer = await client.get("/console/live?page=overview")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert "unsafe-inline" not in answer.headers["content-security-policy"]
    assert answer.text.startswith("retry: 5000\n\n")
    assert answer.text.endswith("event: end\ndata: {}\n\n")
    # How many updates fit in the stream's time depends on the machine's load: at least the
    # first, sent at once. The rates need two samples; tests/console/test_numbers.py checks
    # them on a clock of its own.
    updates = _messages(answer.text)
    assert len(updates) >= 1
    assert all(update["page"] == "overview" for update in updates)
    assert updates[-1]["fields"]["redis"] == "ok" and updates[-1]["fields"]["database"] == "ok"
    assert "requests_per_s" in updates[-1]["fields"]


async def test_the_packet_and_activity_streams_carry_their_hooks(
    served: tuple[Starlette, httpx.AsyncClient],
) -> None:
    _app, client = served
    await client.post(
        "/v1/accounts/s1/deposits", json={"amount_cents": 900, "reference": "d1"}, headers=ADMIN
    )
    sent = await client.post(
        "/v1/redpackets",
        json={"sender_id": "s1", "amount_cents": 300, "count": 3, "packet_id": "p1"},
        headers=SERVICE,
    )
    assert sent.status_code == 201, sent.text
    grabbed = await client.post("/v1/redpackets/p1/grab", json={"user_id": "g1"}, headers=SERVICE)
    assert grabbed.status_code == 200
    made = await client.post("/v1/activities", json={"activity_id": "a1"}, headers=ADMIN)
    assert made.status_code == 201
    await _signed_in(client)
    packet = _messages((await client.get("/console/live?page=packet&id=p1")).text)[-1]
    assert packet["fields"]["remaining_count"] == 2
    assert packet["fields"]["status"] == "active"
    assert packet["fields"]["remaining_cents"] == 300 - grabbed.json()["amount_cents"]
    activity = _messages((await client.get("/console/live?page=activity&id=a1")).text)[-1]
    body = (await client.get("/v1/activities/a1", headers=SERVICE)).json()
    expected = {
        k: body[k]
        for k in ("teams_open", "teams_formed", "teams_failed", "members", "live_locks", "waiting")
        if k in body
    }
    # the panel's counts, beside the sale's figures (tests/console/test_sale_view.py)
    assert (activity["page"], activity["id"]) == ("activity", "a1")
    assert {k: activity["fields"][k] for k in expected} == expected
    assert activity["fields"]["locks_taken_window"] == 0
    assert activity["tables"] == {"refused_by_code": {}}
    twin = await client.get("/console/live.json?page=packet&id=p1")
    assert twin.status_code == 200 and twin.json() == packet


async def test_the_events_stream_moves_on_from_its_last_id(
    served: tuple[Starlette, httpx.AsyncClient],
) -> None:
    _app, client = served
    await client.post("/v1/activities", json={"activity_id": "a1"}, headers=ADMIN)
    opened = await client.post(
        "/v1/activities/a1/teams", json={"leader_id": "L", "team_id": "t1"}, headers=SERVICE
    )
    assert opened.status_code == 201
    await client.post("/v1/admin/jobs/flush_records/run", headers=ADMIN)
    await _signed_in(client)
    updates = _messages((await client.get("/console/live?page=events&after=0")).text)
    first, *rest = updates
    assert [event["type"] for event in first["events"]] == ["team.opened"]
    assert all(update["events"] == [] for update in rest)  # each event is pushed once
    assert updates[-1]["next_after"] == first["events"][-1]["id"]
    other = await client.get("/console/live.json?page=events&after=0&type=packet.sent")
    assert other.json()["events"] == []


async def test_live_answers_need_a_session_and_a_known_page(
    served: tuple[Starlette, httpx.AsyncClient],
) -> None:
    _app, client = served
    for path in ("/console/live?page=overview", "/console/live.json?page=overview"):
        assert (await client.get(path)).status_code == 401
    await _signed_in(client)
    for query in ("page=nothing", "page=packet", "page=packet&id=bad%20id", "page=events&after=x"):
        for path in ("/console/live", "/console/live.json"):
            answer = await client.get(f"{path}?{query}")
            assert answer.status_code == 400, (path, query, answer.text)
    missing = await client.get("/console/live.json?page=packet&id=nope")
    assert missing.status_code == 404


class _Stream:
    """A live stream called straight through ASGI, so the test holds it open."""

    def __init__(self, app: Starlette, cookie: str) -> None:
        self.messages: list[MutableMapping[str, Any]] = []
        self.updated = asyncio.Event()
        self.leave = asyncio.Event()
        self._asked = False
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/console/live",
            "raw_path": b"/console/live",
            "query_string": b"page=overview",
            "root_path": "",
            "headers": [(b"host", b"testserver"), (b"cookie", cookie.encode())],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        self.task = asyncio.create_task(app(scope, self._receive, self._send))

    async def _receive(self) -> dict[str, Any]:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        self.messages.append(message)
        if message["type"] == "http.response.body" and b"data: {" in message.get("body", b""):
            self.updated.set()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if "body" in m)


async def test_streams_are_capped_and_give_their_place_back(
    settings: Settings,
) -> None:
    app = create_app(settings.replace("console", live_connections=1, live_stream_s=60))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            await _signed_in(client)
            cookie = f"groupbuy_console={client.cookies['groupbuy_console']}"
            counted = console_context(app).live
            held = _Stream(app, cookie)
            await asyncio.wait_for(held.updated.wait(), WAIT_S)
            assert counted.open == 1
            refused = await client.get("/console/live?page=overview")
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "5"
            assert refused.text == "Too many live connections: retry in a few seconds."
            assert "unsafe-inline" not in refused.headers["content-security-policy"]
            # the browser goes away: the stream ends and its place is free again
            held.leave.set()
            await asyncio.wait_for(held.task, WAIT_S)
            assert counted.open == 0
            again = _Stream(app, cookie)
            await asyncio.wait_for(again.updated.wait(), WAIT_S)
            assert again.messages[0]["status"] == 200
            # the server shuts down: the stream says so and ends by itself
            streams.stop_all()
            await asyncio.wait_for(again.task, WAIT_S)
            assert again.body.endswith(b"event: end\ndata: {}\n\n")
            assert counted.open == 0
            assert (await client.get("/console/live?page=overview")).status_code == 503


async def test_one_session_holds_a_few_streams_and_others_still_get_theirs(
    settings: Settings,
) -> None:
    capped = settings.replace(
        "console", live_connections=10, live_connections_per_session=2, live_stream_s=60
    )
    app = create_app(capped)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url=BASE) as greedy,
            httpx.AsyncClient(transport=transport, base_url=BASE) as other,
        ):
            await _signed_in(greedy)
            await _signed_in(other)
            cookie = f"groupbuy_console={greedy.cookies['groupbuy_console']}"
            held = [_Stream(app, cookie), _Stream(app, cookie)]
            for stream in held:
                await asyncio.wait_for(stream.updated.wait(), WAIT_S)
            refused = await greedy.get("/console/live?page=overview")
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "5"
            assert "polls instead" in refused.text
            # the page's fallback still answers that session
            assert (await greedy.get("/console/live.json?page=overview")).status_code == 200
            # another operator's session is not crowded out
            theirs = _Stream(app, f"groupbuy_console={other.cookies['groupbuy_console']}")
            await asyncio.wait_for(theirs.updated.wait(), WAIT_S)
            assert theirs.messages[0]["status"] == 200
            # one of the session's streams ends: the session may open one again
            held[0].leave.set()
            await asyncio.wait_for(held[0].task, WAIT_S)
            again = _Stream(app, cookie)
            await asyncio.wait_for(again.updated.wait(), WAIT_S)
            assert again.messages[0]["status"] == 200
            streams.stop_all()
            await asyncio.gather(*(s.task for s in (held[1], theirs, again)))
            assert console_context(app).live.open == 0
            assert console_context(app).live.by_session == {}


async def test_sign_out_ends_the_sessions_open_streams(settings: Settings) -> None:
    app = create_app(settings.replace("console", live_stream_s=60))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            await _signed_in(client)
            cookie = f"groupbuy_console={client.cookies['groupbuy_console']}"
            held = _Stream(app, cookie)
            await asyncio.wait_for(held.updated.wait(), WAIT_S)
            csrf = csrf_of((await client.get("/console")).text)
            out = await client.post("/console/signout", data={"csrf": csrf})
            assert out.status_code == 303
            # the stream ends at its next update, long before live_stream_s
            await asyncio.wait_for(held.task, WAIT_S)
            assert held.body.endswith(b"event: end\ndata: {}\n\n")
            assert console_context(app).live.open == 0
