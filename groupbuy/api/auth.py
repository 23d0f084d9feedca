"""Bearer-key authentication (which role a request's key grants) and signed requests."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError
from starlette.requests import Request

from groupbuy import errors
from groupbuy.settings import ApiKey
from groupbuy.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature, target_of
from groupbuy.storage.signatures import SeenSignatures

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
