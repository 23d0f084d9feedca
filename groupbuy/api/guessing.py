"""Key guessing throttled at the HTTP edge (SPEC §3; groupbuy/storage/guesses.py counts).

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

from starlette.requests import Request

from groupbuy import errors, metrics
from groupbuy.api.auth import Authenticator
from groupbuy.settings import ApiKey
from groupbuy.storage.guesses import GuessThrottle

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
