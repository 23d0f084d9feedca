"""Starlette behaviour groupbuy/api relies on that its documentation does not promise: the
matched route in the scope, the router's redirect flag, a response's raw header list,
one scope shared by the layers, and where a request's body is read."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SCOPE_KEY = "contract.fields"
FIELDS = [(b"ratelimit-policy", b'"contract";q=5;w=1')]


async def ok(request: Request) -> Response:
    return JSONResponse({"ok": True})


def client(app: Starlette, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://contract")


class RouteSeen:
    """Pure ASGI middleware that reads scope["route"] after the app answered, as
    ObserveRequests does."""

    def __init__(self, app: Any, seen: list[str | None]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
        self.seen.append(getattr(scope.get("route"), "path", None))


async def test_router_sets_scope_route_for_a_match_and_for_a_405() -> None:
    """groupbuy/api/middleware.py, route_of (ObserveRequests labels metrics and access lines
    by route template) and groupbuy/api/problems.py, _answer: the router writes the route it
    matched into the scope the middleware passed in, for a wrong method (405) too; an
    unmatched path leaves no route."""
    seen: list[str | None] = []
    app = Starlette(
        routes=[Route("/teams/{team_id}", ok, methods=["GET"])],
        middleware=[Middleware(RouteSeen, seen=seen)],
    )
    async with client(app) as http:
        statuses = [
            (await http.get("/teams/t1")).status_code,
            (await http.post("/teams/t1")).status_code,
            (await http.get("/nothing/here")).status_code,
        ]
    assert statuses == [200, 405, 404]
    assert seen == ["/teams/{team_id}", "/teams/{team_id}", None]


async def test_router_redirect_slashes_set_after_construction_turns_the_redirect_off() -> None:
    """groupbuy/api/app.py, create_app: `app.router.redirect_slashes = False` after the app
    is built makes a trailing '/' a 404 (an empty id) instead of a redirect to the route."""
    kept = Starlette(routes=[Route("/teams", ok)])
    turned_off = Starlette(routes=[Route("/teams", ok)])
    turned_off.router.redirect_slashes = False
    async with client(kept) as http:
        assert (await http.get("/teams/", follow_redirects=False)).status_code == 307
    async with client(turned_off) as http:
        assert (await http.get("/teams/", follow_redirects=False)).status_code == 404
        assert (await http.get("/teams")).status_code == 200


class Refused(Exception):
    """An error of ours, answered by an exception handler (as GroupBuyError is)."""


async def refuse(request: Request) -> Response:
    request.scope[SCOPE_KEY] = FIELDS
    if request.path_params["how"] == "ours":
        raise Refused("no")
    raise RuntimeError("a bug")


async def answer_with_fields(request: Request, exc: Exception) -> Response:
    status = 429 if isinstance(exc, Refused) else 500
    response = JSONResponse({"error": type(exc).__name__}, status_code=status)
    response.raw_headers.extend(request.scope.get(SCOPE_KEY, ()))
    return response


async def test_exception_handler_request_scope_is_the_scope_the_endpoint_wrote() -> None:
    """groupbuy/api/problems.py, handle_error (with groupbuy/api/access.py, take): what
    an endpoint writes into request.scope is in the scope of the request an exception
    handler gets, for an error of ours (ExceptionMiddleware) and for a bug (the handler of
    Exception, ServerErrorMiddleware)."""
    app = Starlette(
        routes=[Route("/refuse/{how}", refuse)],
        exception_handlers={Refused: answer_with_fields, Exception: answer_with_fields},
    )
    async with client(app, raise_app_exceptions=False) as http:
        ours = await http.get("/refuse/ours")
        bug = await http.get("/refuse/bug")
    assert (ours.status_code, ours.json()) == (429, {"error": "Refused"})
    assert (bug.status_code, bug.json()) == (500, {"error": "RuntimeError"})
    for answer in (ours, bug):
        assert answer.headers["ratelimit-policy"] == '"contract";q=5;w=1'


async def test_response_raw_headers_extended_after_construction_are_sent() -> None:
    """groupbuy/api/problems.py, handle_error: `response.raw_headers.extend(fields)` on a
    built JSONResponse adds those header fields to the answer, beside its own
    content-type and content-length."""

    async def endpoint(request: Request) -> Response:
        response = JSONResponse({"ok": True}, status_code=429)
        response.raw_headers.extend(FIELDS)
        return response

    app = Starlette(routes=[Route("/", endpoint)])
    async with client(app) as http:
        answer = await http.get("/")
    assert answer.status_code == 429
    assert answer.headers["ratelimit-policy"] == '"contract";q=5;w=1'
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"ok": True}


class TimedReads:
    """Pure ASGI middleware that wraps receive, as LimitBodyTime does: it notes the task of
    its own call and of each read, and fails the reads of a request that asks for it."""

    def __init__(self, app: Any, tasks: list[tuple[str, asyncio.Task[Any] | None]]) -> None:
        self.app = app
        self.tasks = tasks

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.tasks.append(("middleware", asyncio.current_task()))
        refuse = (b"x-refuse", b"1") in scope["headers"]

        async def receive_in_time() -> Any:
            self.tasks.append(("read", asyncio.current_task()))
            if refuse:
                raise Refused("too slow")
            return await receive()

        await self.app(scope, receive_in_time, send)


async def read_body(request: Request) -> Response:
    body = b"".join([chunk async for chunk in request.stream()])
    return Response(body)


async def test_request_stream_reads_through_the_middleware_receive_in_the_middleware_task() -> None:
    """groupbuy/api/middleware.py, LimitBodyTime: request.stream() in the endpoint calls the
    receive the middleware passed on, in the very task that runs the middleware (so
    cancelling that task interrupts the read), and an error that receive raises reaches
    the app's exception handler."""

    async def too_slow(request: Request, exc: Exception) -> Response:
        return Response(status_code=408)

    tasks: list[tuple[str, asyncio.Task[Any] | None]] = []
    app = Starlette(
        routes=[Route("/body", read_body, methods=["POST"])],
        middleware=[Middleware(TimedReads, tasks=tasks)],
        exception_handlers={Refused: too_slow},
    )
    async with client(app) as http:
        answer = await http.post("/body", content=b"payload")
        refused = await http.post("/body", content=b"payload", headers={"x-refuse": "1"})
    assert (answer.status_code, answer.content) == (200, b"payload")
    assert refused.status_code == 408
    by_request: list[list[tuple[str, asyncio.Task[Any] | None]]] = []
    for kind, task in tasks:
        if kind == "middleware":
            by_request.append([])
        by_request[-1].append((kind, task))
    assert len(by_request) == 2
    for calls in by_request:
        assert [kind for kind, _task in calls][:2] == ["middleware", "read"]
        assert len({task for _kind, task in calls}) == 1


async def test_request_stream_raises_client_disconnect_on_http_disconnect() -> None:
    """groupbuy/api/problems.py, _answer (and HANDLED_ERRORS): when the client goes away
    while its body is read, request.stream() raises ClientDisconnect, which reaches the
    app's exception handler."""
    handled: list[type[Exception]] = []

    async def gone(request: Request, exc: Exception) -> Response:
        handled.append(type(exc))
        return Response(status_code=499)

    app = Starlette(
        routes=[Route("/body", read_body, methods=["POST"])],
        exception_handlers={ClientDisconnect: gone},
    )
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"part", "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/body",
        "raw_path": b"/body",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-length", b"100")],
        "client": ("127.0.0.1", 1),
        "server": ("contract", 80),
    }
    await app(scope, receive, send)
    assert handled == [ClientDisconnect]
    assert sent[0]["status"] == 499
