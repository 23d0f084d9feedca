"""Who may call, and how often: bearer keys and their roles, signed requests, the
key-guessing throttle and the rate limits (groupbuy/storage/throttles.py decides those
two in Redis).

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
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from typing import Any

from groupbuy_client.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature, target_of
from redis.exceptions import RedisError
from starlette.requests import Request

from groupbuy import errors, metrics
from groupbuy.settings import ApiKey
from groupbuy.storage.signatures import SeenSignatures
from groupbuy.storage.throttles import GuessThrottle, RateDecision, RateLimitService, RatePlan

_TIMESTAMP = TIMESTAMP_HEADER.lower()
_SIGNATURE = SIGNATURE_HEADER.lower()
# Unix seconds: digits only (no sign, no fraction), bounded so int() stays cheap.
_MAX_TIMESTAMP_DIGITS = 12


class Authenticator:
    """Checks bearer keys against the configured `role:secret` pairs in constant time, and
    the signatures of signed requests (required globally or of some keys)."""

    def __init__(
        self,
        keys: tuple[ApiKey, ...],
        seen: SeenSignatures,
        *,
        fingerprints: FingerprintKey,
        signed_requests: bool = False,
        skew_s: int = 300,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys = [(key, key.secret.encode()) for key in keys]
        self._fingerprints = fingerprints
        self._ids: dict[str, str] = {}  # by secret: a str hashes faster than the key
        # Names rate-limit buckets while the fingerprint secret cannot be read (Redis away).
        self._stand_in = secrets.token_bytes(32)
        self._signed_requests = signed_requests
        self._skew_s = skew_s
        self._seen = seen
        # The process clock, not Redis TIME: Redis is the authority for business time, but
        # a +-skew window of whole seconds tolerates the few ms two clocks disagree by, and
        # reading TIME would cost every signed request a second Redis round trip.
        self._clock = clock

    def key_of(self, authorization: str | None) -> ApiKey | None:
        """The key a header's bearer secret names, or None."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        presented = token.strip().encode()
        found = None
        # Compare with every key, not stopping at a match, so timing reveals nothing.
        for key, secret in self._keys:
            if hmac.compare_digest(presented, secret) and found is None:
                found = key
        return found

    def require(self, request: Request, needed: str) -> ApiKey:
        """The request's key; 401 without a valid one, 403 when its role may not call this."""
        key = self.key_of(request.headers.get("authorization"))
        if key is None:
            raise errors.Unauthorized()
        if key.role not in accepted_roles(request.method, needed):
            if key.role == "viewer":
                raise errors.Forbidden("a `viewer` key may only read (GET)")
            raise errors.Forbidden()
        return key

    async def key_id(self, key: ApiKey) -> str:
        """The name of `key` where its secret must not appear (the audit log, the Redis keys
        of its rate limits): its fingerprint under the server's fingerprint key."""
        found = self._ids.get(key.secret)
        if found is None:
            found = self._ids[key.secret] = fingerprint(key.secret, await self._fingerprints.get())
        return found

    async def bucket_id(self, key: ApiKey) -> str:
        """The name of `key`'s rate-limit buckets: its fingerprint, or while Redis cannot
        give the fingerprint secret, a name under a key of this process (the rate limiter
        then finds Redis away too, and lets the request through as it does then)."""
        try:
            return await self.key_id(key)
        except (RedisError, OSError):
            return fingerprint(key.secret, self._stand_in)

    def must_check_signature(self, request: Request, key: ApiKey) -> bool:
        """True when the request has to carry a valid signature: signing is required of
        every key or of this one, or the request carries signature headers anyway (a
        signature that is there is never ignored)."""
        headers = request.headers
        return self._signed_requests or key.signed or _TIMESTAMP in headers or _SIGNATURE in headers

    async def check_signature(self, request: Request, key: ApiKey, body: bytes) -> None:
        """401 bad_signature unless the request is signed by `key`'s secret, within the
        clock skew, and its signature was not seen before."""
        headers = request.headers
        stamp, presented = headers.get(_TIMESTAMP, ""), headers.get(_SIGNATURE, "")
        if not stamp or not presented:
            raise errors.BadSignature(
                f"signed requests carry {TIMESTAMP_HEADER} and {SIGNATURE_HEADER}",
                reason="missing",
            )
        if not stamp.isascii() or not stamp.isdigit() or len(stamp) > _MAX_TIMESTAMP_DIGITS:
            raise errors.BadSignature(
                f"{TIMESTAMP_HEADER} must be Unix seconds", reason="malformed"
            )
        if abs(self._clock() - int(stamp)) > self._skew_s:
            raise errors.BadSignature(
                f"{TIMESTAMP_HEADER} is more than {self._skew_s} s from the server's clock",
                reason="stale",
            )
        scope = request.scope
        path = (scope.get("raw_path") or scope["path"].encode()).split(b"?", 1)[0]
        target = target_of(path, scope.get("query_string") or b"")
        expected = signature(key.secret, request.method, target, stamp, body)
        if not hmac.compare_digest(presented.encode(), expected.encode()):
            raise errors.BadSignature("the signature does not match the request", reason="wrong")
        if not await self._seen.first_use(expected):
            raise errors.BadSignature(
                "this signature was used before (a replayed request)", reason="replayed"
            )


async def actor(auth: Authenticator, key: ApiKey) -> str:
    """How the audit log names the key that acted: `<role>:<fingerprint>`, never its secret."""
    return f"{key.role}:{await auth.key_id(key)}"


READ_METHODS = frozenset({"GET", "HEAD"})


def accepted_roles(method: str, needed: str) -> tuple[str, ...]:
    """The roles whose keys may call an operation of `method` that needs role `needed`:
    `admin` everything, `service` what needs `service`, `viewer` every read."""
    roles = ("admin",) if needed == "admin" else (needed, "admin")
    return (*roles, "viewer") if method.upper() in READ_METHODS else roles


FINGERPRINT_DIGITS = 16


def fingerprint(secret: str, server_key: bytes) -> str:
    """A key's name for the places its secret must not appear: the first 16 hex digits of
    the HMAC-SHA256 of the secret keyed by the server's fingerprint key. Without that key a
    reader of the audit log cannot test guesses of a secret offline."""
    digest = hmac.new(server_key, secret.encode(), hashlib.sha256).hexdigest()
    return digest[:FINGERPRINT_DIGITS]


class FingerprintKey:
    """The server-side key of key fingerprints: `[auth] fingerprint_secret` when set, else
    a random one made once and kept in Redis (SET NX: the first process to start makes it,
    every other process and replica reads the same one). Read once per process."""

    def __init__(self, configured: str, redis: Any = None, redis_key: str = "") -> None:
        self._value = configured.encode() if configured else None
        self._redis = redis
        self._redis_key = redis_key

    async def get(self) -> bytes:
        """The key (from Redis on the first call when none is configured)."""
        if self._value is None:
            self._value = await self._kept()
        return self._value

    async def _kept(self) -> bytes:
        if self._redis is None:
            raise RuntimeError("no fingerprint secret configured and no Redis to keep one")
        for _attempt in range(3):  # SET NX then GET: racing processes read the one that won
            await self._redis.set(self._redis_key, secrets.token_hex(32), nx=True)
            found = await self._redis.get(self._redis_key)
            if found is not None:
                return found.encode() if isinstance(found, str) else bytes(found)
        raise RuntimeError(f"Redis does not keep {self._redis_key}")


# Bearer-key authentication above; the throttles in front of it and behind it below.

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
