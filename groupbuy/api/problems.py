"""problem+json answers, and the one handler that turns every failure into one."""

from __future__ import annotations

import logging
from typing import Any

import redis.exceptions
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from groupbuy import errors
from groupbuy.api.access import SCOPE_KEY as RATELIMIT_FIELDS
from groupbuy.api.endpoints import FastJSONResponse
from groupbuy.metrics import BACKEND_ERRORS, count_problem, note_outcome
from groupbuy.storage.db import FAILURES as DATABASE_FAILURES
from groupbuy.storage.db import unavailable as database_unavailable
from groupbuy.storage.reachability import UNREACHABLE, unreachable

log = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499
"""The status the access log and the metrics give a request whose client went away before
it was read (nginx's "client closed request"); nothing is sent."""


PROBLEMS_PATH = "/docs/problems"
"""The service's page that documents every problem code (groupbuy.api.pages)."""


def problem_type(code: str) -> str:
    """A code's problem type: a URI relative to the service (RFC 9457 allows it), naming
    the code's entry on the service's own problem page."""
    return f"{PROBLEMS_PATH}#{code}"


def problem_body(error: errors.GroupBuyError) -> dict[str, Any]:
    """The RFC 9457 body for an error: its type URI, title, status, code, detail and the
    context it carries."""
    return {
        "type": problem_type(error.code),
        "title": error.title,
        "status": error.status_code,
        "code": error.code,
        "detail": error.detail,
        **error.extra,
    }


def problem_response(error: errors.GroupBuyError) -> JSONResponse:
    """An application/problem+json answer for an error (its code is the request's outcome)."""
    note_outcome(error.code)
    count_problem(error)  # the console's outcomes by code (groupbuy/console/sampler.py)
    headers = {"WWW-Authenticate": "Bearer"} if error.status_code == 401 else None
    if isinstance(error, errors.RateLimited):
        headers = {"Retry-After": str(error.extra["retry_after_s"])}
    return FastJSONResponse(
        problem_body(error),
        status_code=error.status_code,
        media_type="application/problem+json",
        headers=headers,
    )


async def handle_error(request: Request, exc: Exception) -> Response:
    """Every failure as problem+json: ours as they are, backing services as 503, bugs as 500;
    with the RateLimit fields when the request was counted against a rate limit."""
    response = _answer(request, exc)
    response.raw_headers.extend(request.scope.get(RATELIMIT_FIELDS, ()))
    return response


def _answer(request: Request, exc: Exception) -> Response:
    if isinstance(exc, errors.GroupBuyError):
        return problem_response(exc)
    if isinstance(exc, ClientDisconnect):
        # The client closed the connection while its body was on the way: nothing went
        # wrong here, and the answer reaches no one (uvicorn drops it).
        log.info(
            "client closed the connection before its request was read: %s %s (%d)",
            request.method,
            getattr(request.scope.get("route"), "path", "unmatched"),
            CLIENT_CLOSED_REQUEST,
        )
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if isinstance(exc, HTTPException):
        if exc.status_code == 404:
            return problem_response(errors.NotFound("no such route"))
        if exc.status_code == 405:
            response = problem_response(errors.MethodNotAllowed())
            response.headers.update(exc.headers or {})  # Allow: the methods that do exist
            return response
        body = {
            "type": "about:blank",
            "title": str(exc.detail),
            "status": exc.status_code,
            "code": "http_error",
            "detail": str(exc.detail),
        }
        return FastJSONResponse(body, exc.status_code, media_type="application/problem+json")
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        # Refused before anything was written (the scripts' shebang makes Redis check first).
        log.warning("redis out of memory: %s", exc)
        BACKEND_ERRORS.labels(backend="redis").inc()
        return problem_response(errors.RedisOutOfMemory())
    if unreachable(exc):
        # Said once per outage by the process's Reachability, not once per request.
        request.app.state.services.reachability.failed(exc)
        BACKEND_ERRORS.labels(backend="redis").inc()
        return problem_response(errors.RedisUnavailable())
    if database_unavailable(exc):
        # Down, starting, unreachable, locked or slow past [database] timeout_s, however the
        # driver says it: said once per outage by the database's Reachability.
        request.app.state.services.database.reachability.failed(exc)
        BACKEND_ERRORS.labels(backend="database").inc()
        return problem_response(errors.DatabaseUnavailable())
    log.error("unhandled error", exc_info=exc)
    return problem_response(errors.InternalError())


# Starlette needs each class named: `Exception` alone only reaches the last-resort handler.
HANDLED_ERRORS: tuple[type[Exception], ...] = (
    errors.GroupBuyError,
    ClientDisconnect,
    HTTPException,
    redis.exceptions.OutOfMemoryError,
    *UNREACHABLE,
    redis.exceptions.RedisClusterException,  # unreachable when caused by a connection error
    *DATABASE_FAILURES,  # unavailable or not: groupbuy.storage.db.unavailable decides
    Exception,
)
