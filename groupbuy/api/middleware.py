"""ASGI middleware: per-request observation (request id, access log line, latency
histogram) and the refusal of ambiguous paths before routing.

The log line names the route *template* (`/v1/redpackets/{packet_id}/grab`), never the
raw path, and never a header or a body: bearer secrets and signatures stay out of logs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import secrets
import time
from collections.abc import Iterable
from typing import Any

from groupbuy_client.wire import ID_PATTERN

from groupbuy import errors
from groupbuy.api import ACCESS_LOGGER
from groupbuy.api.problems import problem_response
from groupbuy.metrics import HTTP_DURATION, REQUEST_OUTCOME, series

REQUEST_ID_HEADER = b"x-request-id"
UNMATCHED = "unmatched"

_SANE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# A path id the access line shows as it is; another (a space, a newline) shows as <invalid>.
_LOGGED_ID = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
# Anything else is labelled OTHER so clients cannot invent label values.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

log = logging.getLogger(ACCESS_LOGGER)


def request_id_of(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The caller's X-Request-Id when it is a sane token (<= 64 of [A-Za-z0-9._-]), else new."""
    for name, value in headers:
        if name.lower() == REQUEST_ID_HEADER:
            text = value.decode("latin-1")
            if _SANE_ID.fullmatch(text):
                return text
            break
    return secrets.token_hex(16)


def route_of(scope: dict[str, Any]) -> str:
    """The template of the route Starlette matched (also for a 405), or `unmatched`."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else UNMATCHED


def method_of(scope: dict[str, Any]) -> str:
    """The request method, or OTHER for one the API does not use."""
    method = str(scope.get("method", ""))
    return method if method in _METHODS else "OTHER"


class ObserveRequests:
    """ASGI middleware: tag each request with an id (echoed as X-Request-Id), time it,
    observe the latency histogram and write one line to the `groupbuy.access` logger."""

    def __init__(self, app: Any, access_log: bool = True) -> None:
        self.app = app
        self.access_log = access_log
        # Bounded: methods, route templates and statuses are finite sets.
        self._latency = series(HTTP_DURATION)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = request_id_of(scope.get("headers") or ())
        outcomes: list[str] = []
        token = REQUEST_OUTCOME.set(outcomes)
        # Stays 500 when the app raises before answering (the outer error middleware answers).
        status = 500

        async def send_with_id(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                # No route sets X-Request-Id itself: the id is added, never duplicated.
                headers = [*message.get("headers", ()), (REQUEST_ID_HEADER, request_id.encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_OUTCOME.reset(token)
            self._observe(scope, status, time.perf_counter() - started, request_id, outcomes)

    def _observe(
        self, scope: Any, status: int, elapsed_s: float, request_id: str, outcomes: list[str]
    ) -> None:
        method, route = method_of(scope), route_of(scope)
        self._latency(method, route, status).observe(elapsed_s)
        if not self.access_log or not log.isEnabledFor(logging.INFO):
            return
        params = scope.get("path_params") or {}
        line_format, names = _access_format(tuple(params))
        ids = [value if _LOGGED_ID.fullmatch(value) else "<invalid>" for value in params.values()]
        args = (
            method,
            route,
            status,
            outcomes[-1] if outcomes else "-",
            round(elapsed_s * 1000, 2),
            *ids,
            (scope.get("client") or ("-",))[0],
            request_id,
        )
        # Logger.info would search the call stack for a source line no access format shows.
        record = log.makeRecord(log.name, logging.INFO, __file__, 0, line_format, args, None)
        record.field_names = names  # the JSON format writes each arg under its name
        log.handle(record)


@functools.lru_cache(maxsize=256)
def _access_format(ids: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The text of an access line with these path ids, and the names of its arguments
    (one per route: made once, not per request)."""
    text = "%s %s %d %s %.2fms " + "".join(f"{name}=%s " for name in ids)
    names = ("method", "route", "status", "outcome", "duration_ms", *ids, "client", "request_id")
    return text + "client=%s request_id=%s", names


class RejectAmbiguousPaths:
    """ASGI middleware: refuse (422) paths with an empty segment or an encoded '/'.

    Routing works on the decoded path, so `a%2Fteams%2Ft1` would otherwise reach another
    route, and `//` or a trailing '/' would mean an empty id.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope["path"].encode()
            path = raw.split(b"?", 1)[0]
            empty_segment = path != b"/" and (b"//" in path or path.endswith(b"/"))
            if empty_segment or b"%2f" in path.lower():
                error = errors.InvalidRequest(
                    f"every path segment must be a non-empty id matching {ID_PATTERN}",
                    errors=[{"field": "path", "message": "empty segment or encoded '/'"}],
                )
                await problem_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class LimitBodyTime:
    """ASGI middleware: a request's body must arrive within `timeout_s` of its head, or the
    read fails with RequestTimeout (408 problem+json, then the connection is closed: the
    rest of a slow body is not waited for).

    No timer per request: a timer per read cost a visible share of a request, most bodies
    arriving with their head. A read only registers its task and deadline; one ticker,
    running while reads wait, cancels the reads past their deadline (so a body is cut
    off between `timeout_s` and `timeout_s` plus a tick, a quarter of it at most 1 s).
    """

    def __init__(self, app: Any, timeout_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self._tick_s = min(1.0, timeout_s / 4)
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._timed_out: set[asyncio.Task[Any]] = set()
        self._ticker: asyncio.TimerHandle | None = None
        self._ticker_loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        task = asyncio.current_task()
        assert task is not None
        body_done = False

        async def receive_in_time() -> Any:
            nonlocal body_done
            if body_done:  # afterwards only http.disconnect comes: not timed
                return await receive()
            self._reading[task] = deadline
            if self._ticker is None or self._ticker_loop is not loop:
                self._ticker_loop = loop
                self._ticker = loop.call_later(self._tick_s, self._tick)
            try:
                message = await receive()
            except asyncio.CancelledError:
                if task not in self._timed_out:
                    raise
                self._timed_out.discard(task)
                task.uncancel()
                raise errors.RequestTimeout(
                    f"the request body did not arrive within {self.timeout_s:g} s"
                ) from None
            finally:
                self._reading.pop(task, None)
            body_done = message["type"] != "http.request" or not message.get("more_body")
            return message

        async def send_closing(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] == 408:
                headers = [*message.get("headers", ()), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive_in_time, send_closing)

    def _tick(self) -> None:
        """Cancel the reads past their deadline (each task waits in its receive(): the only
        await while it is registered); run again while reads wait."""
        self._ticker = None
        loop = self._ticker_loop
        if loop is None or not self._reading:
            return
        now = loop.time()
        for task, deadline in list(self._reading.items()):
            if deadline <= now:
                del self._reading[task]
                self._timed_out.add(task)
                task.cancel()
        if self._reading:
            self._ticker = loop.call_later(self._tick_s, self._tick)
