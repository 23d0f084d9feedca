"""Bearer-key authentication (which role a request's key grants) and signed requests."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable

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
        signed_requests: bool = False,
        skew_s: int = 300,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._keys = [(key, key.secret.encode()) for key in keys]
        self._ids = {key: key_id(key.secret) for key in keys}
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

    def key_id(self, key: ApiKey) -> str:
        """The name of `key` where its secret must not appear (the Redis keys of its rate
        limits)."""
        return self._ids[key]

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


def actor(auth: Authenticator, key: ApiKey) -> str:
    """How the audit log names the key that acted: `<role>:<fingerprint>`, never its secret."""
    return f"{key.role}:{auth.key_id(key)}"


READ_METHODS = frozenset({"GET", "HEAD"})


def accepted_roles(method: str, needed: str) -> tuple[str, ...]:
    """The roles whose keys may call an operation of `method` that needs role `needed`:
    `admin` everything, `service` what needs `service`, `viewer` every read."""
    roles = ("admin",) if needed == "admin" else (needed, "admin")
    return (*roles, "viewer") if method.upper() in READ_METHODS else roles


def key_id(secret: str) -> str:
    """A key's name for the places its secret must not appear: the first 16 hex digits of
    the secret's SHA-256."""
    return hashlib.sha256(secret.encode()).hexdigest()[:16]
