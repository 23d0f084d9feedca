"""Live updates: one server-sent-events stream per open page, pushing what the page shows
every `[console] live_interval_s`, and its JSON twin for browsers that cannot stream.

Each update is one bounded read: the overview's shared snapshot, one activity row (and
its sale's funnel: a TIME and one pipeline of HGETALL and SCARD in its slot), one packet
script call, one page of the feed, or a list's page again (the service call of its API
listing: one SQL page and its live values). Streams per process are capped, and so are
those of one signed-in session (one operator cannot take every place); a stream
ends after `[console] live_stream_s` (the browser reconnects, and its session is checked
again) or when the server shuts down (`streams.stop_all`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from groupbuy.console import feed, params
from groupbuy.console.context import Context
from groupbuy.console.overview import TABLES
from groupbuy.console.pages import ACTIVITY_FIELDS, PACKET_FIELDS, PAGE
from groupbuy.console.sale import sale_view
from groupbuy.console.streams import LiveStreams

PAGES = ("overview", "activity", "packet", "events", "activities", "packets")
RETRY_AFTER_S = 5


class _Stream(StreamingResponse):
    """A stream that gives its place back under the cap however it ends (finished, client
    gone before or while it ran, cancelled)."""

    def __init__(self, body: AsyncIterator[bytes], streams: LiveStreams, session: str) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"X-Accel-Buffering": "no"},  # proxies must not hold the updates back
        )
        self._streams = streams
        self._session = session

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._streams.give_back(self._session)


class Watched:
    """What one page watches, read once per update."""

    def __init__(self, request: Request, ctx: Context) -> None:
        query = request.query_params
        self.page = query.get("page", "")
        if self.page not in PAGES:
            raise ValueError(f"page must be one of {', '.join(PAGES)}")
        self.id = ""
        if self.page in ("activity", "packet"):
            self.id = params.an_id(query.get("id"), "id")
        self.after = params.position(query.get("after"), "after") or 0
        self.wanted = feed.FeedFilter.of(query)
        self.status: str | None = None
        self.cursor: str | None = None
        self.sender: str | None = None
        if self.page == "activities":
            self.status = params.one_of(query.get("status"), params.ACTIVITY_STATUSES, "status")
            self.cursor = params.page_cursor(query.get("cursor"))
        if self.page == "packets":
            self.status = params.one_of(query.get("status"), params.PACKET_STATUSES, "status")
            self.cursor = params.packet_cursor(query.get("cursor"))
            self.sender = params.id_cursor(query.get("sender_id"), "sender_id")
        self._ctx = ctx

    async def update(self) -> dict[str, Any]:
        """The page's numbers now (and, for the events page, the events since the last
        update: `after` moves on)."""
        services = self._ctx.services
        if self.page == "overview":
            numbers = dict(await self._ctx.overview.numbers())
            lag = numbers.pop("webhook_lag")
            for endpoint, values in lag.items():
                numbers[f"webhook_lag.{endpoint}"] = values["lag_s"]
                numbers[f"webhook_pending.{endpoint}"] = values["pending"]
            tables = {name: numbers.pop(name) for name in TABLES}
            return {"page": self.page, "fields": numbers, "tables": tables}
        if self.page == "activity":
            body = await services.teams.activities.get_activity(self.id)
            fields = {name: body[name] for name in ACTIVITY_FIELDS if name in body}
            sale = await sale_view(services, body)
            fields.update(sale.fields)
            tables = {"refused_by_code": sale.refused}
            return {"page": self.page, "id": self.id, "fields": fields, "tables": tables}
        if self.page == "packet":
            packet: dict[str, Any] = dict(await services.packets.reads.get(self.id))
            fields = {name: packet[name] for name in PACKET_FIELDS}
            return {"page": self.page, "id": self.id, "fields": fields}
        if self.page == "activities":  # the page's SQL rows and their live counts, again
            listed = await services.teams.listings.activities(self.status, PAGE, self.cursor)
            rows = {
                body["activity_id"]: {n: body[n] for n in ACTIVITY_FIELDS if n in body}
                for body in listed["activities"]
            }
            return {"page": self.page, "rows": rows}
        if self.page == "packets":
            found_packets = await services.packets.listing.packets(
                PAGE, self.cursor, sender_id=self.sender, status=self.status
            )
            rows = {
                body["packet_id"]: {n: body[n] for n in PACKET_FIELDS}
                for body in found_packets["packets"]
            }
            return {"page": self.page, "rows": rows}
        found = await feed.read_page(services.database, self.after, self.wanted)
        self.after = found["next_after"]
        return {"page": self.page, "events": found["events"], "next_after": self.after}


def _message(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _updates(
    watched: Watched, streams: LiveStreams, signed_in: Callable[[], Awaitable[bool]]
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    ends = loop.time() + streams.lifetime_s
    yield f"retry: {RETRY_AFTER_S * 1000}\n\n".encode()
    while not streams.stopping and loop.time() < ends:
        try:
            # A sign-out (in any process) ends the session's streams at their next update.
            if not await signed_in():
                break
            yield _message(await watched.update())
        except Exception as exc:  # a failed read is said on the stream; the page stays up
            yield b"event: trouble\n" + _message({"error": type(exc).__name__})
        await asyncio.sleep(streams.interval_s)
    yield b"event: end\ndata: {}\n\n"


def stream(request: Request, ctx: Context, session: str) -> Response:
    """The stream of a page's updates for the signed-in `session`; 429 with Retry-After past
    the streams one session may hold, 503 past the cap of all of them."""
    streams = ctx.live
    try:
        watched = Watched(request, ctx)
    except Exception as exc:
        return PlainTextResponse(str(exc), status_code=400)
    if streams.by_session.get(session, 0) >= streams.per_session:
        return PlainTextResponse(
            f"This session holds {streams.per_session} live connections already "
            "(close a tab): this page polls instead.",
            status_code=429,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    if streams.open >= streams.cap or streams.stopping:
        return PlainTextResponse(
            "Too many live connections: retry in a few seconds.",
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    streams.take(session)
    updates = _updates(watched, streams, lambda: ctx.gate.signed_in(session))
    return _Stream(updates, streams, session)


async def snapshot(request: Request, ctx: Context) -> Response:
    """The JSON twin: one update, for polling."""
    try:
        watched = Watched(request, ctx)
    except Exception as exc:
        return PlainTextResponse(str(exc), status_code=400)
    return Response(orjson.dumps(await watched.update()), media_type="application/json")
