"""Rate limits at the HTTP edge: which bucket a request takes from, and the headers.

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
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request

from groupbuy import errors
from groupbuy.storage.ratelimit import RateDecision, RateLimitService, RatePlan

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
