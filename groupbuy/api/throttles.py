"""The request throttles at the HTTP edge (groupbuy/storage/throttles.py decides in Redis).

Rate limits: which bucket a request takes from, and the headers.

A route of a class (`seat`, `grab`, `send`, `read`; Endpoint.rate_class) takes one request
from its API key's bucket of that class and, when the route names a user
(Endpoint.rate_user: a path parameter or a body field), from that user's bucket too. The
user id of most POST routes is in the JSON body, so the check runs after the body is
parsed and validated: a malformed request costs no Redis call. Admin routes and the
unauthenticated operations routes have no class and no limit.

Answers carry the fields of the IETF draft "RateLimit header fields for HTTP"
(draft-ietf-httpapi-ratelimit-headers-09, the structured-field form): one quota policy
per bucket that applied, named `<class>-<subject>`, e.g.

    RateLimit-Policy: "grab-key";q=100000;w=1, "grab-user";q=20;w=2
    RateLimit: "grab-key";r=99998;t=1, "grab-user";r=19;t=1

where `q` requests at most are let through at once and refill over `w` seconds, `r`
requests could follow now and `t` seconds from now the bucket is full again. A refused
request is answered 429 `rate_limited` with `Retry-After` (whole seconds, at least 1),
and nothing behind the route runs.

Key guessing (SPEC §3).

Every route that needs a key, and the console's sign-in, first asks whether the client
address is refused: a refused address gets 429 `rate_limited` with `Retry-After` before
its key is even looked at, so a right key is refused too until the window ends. A missing
or wrong key (401 `unauthorized`), a bad signature (401 `bad_signature`) and a failed
console sign-in each count one failure of the address.

The client address is the request's ASGI `client`: the direct peer, or, when that peer is
one of `[auth] trusted_proxies`, the right-most `X-Forwarded-For` address that is not
itself a trusted proxy (uvicorn's ProxyHeadersMiddleware, which the app installs with
those proxies, writes it there; uvicorn's own, which trusts 127.0.0.1, is off).
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request

from groupbuy import errors, metrics
from groupbuy.api.auth import Authenticator
from groupbuy.settings import ApiKey
from groupbuy.storage.throttles import GuessThrottle, RateDecision, RateLimitService, RatePlan

SCOPE_KEY = "groupbuy.ratelimit"
"""Where a request's RateLimit header fields wait in its ASGI scope, for the error handler
(problems.handle_error) to add them to an error answer too."""

RawFields = list[tuple[bytes, bytes]]


@functools.lru_cache(maxsize=64)
def _formats(plan: RatePlan) -> tuple[bytes, str]:
    """A plan's RateLimit-Policy value, and the RateLimit value with room for r and t."""
    policy = ", ".join(
        f'"{name}";q={quota};w={window_s}'
        for name, quota, window_s in zip(plan.names, plan.quotas, plan.windows_s, strict=True)
    )
    state = ", ".join(f'"{name}";r={{}};t={{}}' for name in plan.names)
    return policy.encode("latin-1"), state


def header_fields(decision: RateDecision) -> RawFields:
    """The RateLimit-Policy and RateLimit fields of one decision (as raw ASGI headers)."""
    policy, state = _formats(decision.plan)
    r = decision.states  # remaining, reset_s, wait_us per bucket
    values = (r[0], r[1]) if len(r) == 3 else (r[0], r[1], r[3], r[4])
    return [(b"ratelimit-policy", policy), (b"ratelimit", state.format(*values).encode("latin-1"))]


def user_of(request: Request, field: str | None, body: Any) -> str | None:
    """The user a request acts for: `field` of the path, else of the parsed body."""
    if field is None:
        return None
    value = request.path_params.get(field)
    if value is None and body is not None:
        value = getattr(body, field, None)
    return value if isinstance(value, str) else None


async def take(request: Request, route_class: str, key_id: str, user_id: str | None) -> RawFields:
    """Take the request from its buckets; the header fields to answer with (none when rate
    limits are off). Raises RateLimited (429) when a bucket refuses."""
    service: RateLimitService = request.app.state.services.ratelimit
    decision = await service.take(route_class, key_id, user_id)
    if decision is None:
        return []
    fields = header_fields(decision)
    request.scope[SCOPE_KEY] = fields
    if not decision.allowed:
        retry_after_s = decision.retry_after_s
        names = [b.name for b in decision.limiting]
        raise errors.RateLimited(
            f"over the rate limit ({', '.join(names)}); retry in {retry_after_s} s",
            retry_after_s=retry_after_s,
            limits=names,
        )
    return fields


LIMIT_NAME = "auth-guesses"
"""How a refusal names the limit that refused, in `limits` (as the rate limits name theirs)."""

_REFUSED = metrics.series(metrics.GUESSES_REFUSED)


def client_address(request: Request) -> str:
    """The address the request's failures count against ('' when the server gave none)."""
    client = request.client
    return client.host if client is not None else ""


async def refused_for(throttle: GuessThrottle, request: Request, surface: str) -> int | None:
    """Seconds until the request's address may try a key again, or None when it may now;
    a refusal is counted in `groupbuy_auth_throttled_total` under `surface`."""
    retry_after_s = await throttle.refused_for(client_address(request))
    if retry_after_s is not None:
        _REFUSED(surface).inc()
    return retry_after_s


def throttled(retry_after_s: int) -> errors.RateLimited:
    """The 429 a refused address gets."""
    return errors.RateLimited(
        "too many failed authentications from this address; "
        f"retry in {retry_after_s} s (any key is refused until then)",
        retry_after_s=retry_after_s,
        limits=[LIMIT_NAME],
    )


async def authenticate(request: Request, auth: Authenticator, needed: str) -> ApiKey:
    """The request's key, as `auth.require` finds it, unless its address is refused (429);
    a 401 counts one failure of the address."""
    throttle: GuessThrottle = request.app.state.services.guesses
    retry_after_s = await refused_for(throttle, request, "api")
    if retry_after_s is not None:
        raise throttled(retry_after_s)
    try:
        return auth.require(request, needed)
    except errors.Unauthorized:
        await throttle.failed(client_address(request))
        raise


async def check_signature(request: Request, auth: Authenticator, key: ApiKey, body: bytes) -> None:
    """`auth.check_signature`; a bad signature (401) counts one failure of the address."""
    try:
        await auth.check_signature(request, key, body)
    except errors.Unauthorized:
        throttle: GuessThrottle = request.app.state.services.guesses
        await throttle.failed(client_address(request))
        raise
