"""Endpoints that are not one engine's: health, readiness, the events feed, the OpenAPI document."""

from __future__ import annotations

import logging

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from groupbuy.events import read_events
from groupbuy.http import Endpoint, LaxQuery, json_response

log = logging.getLogger(__name__)


class EventsQuery(LaxQuery):
    """Query of GET /v1/events."""

    after: int = Field(default=0, ge=0, le=2**63 - 1)
    limit: int = Field(default=100, ge=1, le=1000)


async def healthz(_request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    services = request.app.state.services
    checks: dict[str, str] = {}
    try:
        await services.redis.ping()
        checks["redis"] = "ok"
        checks["scripts"] = "ok" if await services.scripts.loaded() else "not loaded"
    except Exception as exc:  # readiness reports, it never raises
        checks["redis"] = f"unreachable: {type(exc).__name__}"
    try:
        await services.database.ping()
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {type(exc).__name__}"
    ready = all(value == "ok" for value in checks.values()) and len(checks) == 3
    return json_response(
        {"status": "ready" if ready else "not ready", "checks": checks}, 200 if ready else 503
    )


async def openapi(request: Request) -> Response:
    return json_response(request.app.state.openapi)


async def list_events(request: Request, query: EventsQuery) -> Response:
    async with request.app.state.services.database.sessions() as session:
        page = await read_events(session, query.after, query.limit)
    return json_response(page)


ENDPOINTS = [
    Endpoint(
        "GET", "/healthz", healthz, "The process is up", role=None, responses={200: "{status: ok}"}
    ),
    Endpoint(
        "GET",
        "/readyz",
        readyz,
        "Redis and SQL reachable, Lua scripts loaded",
        role=None,
        responses={200: "ready", 503: "not ready, with the failing checks"},
    ),
    Endpoint(
        "GET",
        "/openapi.json",
        openapi,
        "This OpenAPI document",
        role=None,
        responses={200: "OpenAPI 3.1"},
    ),
    Endpoint(
        "GET",
        "/v1/events",
        list_events,
        "Events after an id, in id order",
        query=EventsQuery,
        tag="events",
        responses={200: "{events: [{id, type, at, data}], next_after}"},
    ),
]
