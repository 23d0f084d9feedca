"""Bearer-key authentication: which role a request's key grants."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from groupbuy import errors
from groupbuy.settings import ApiKey


class Authenticator:
    """Checks bearer keys against the configured `role:secret` pairs in constant time."""

    def __init__(self, keys: tuple[ApiKey, ...]) -> None:
        self._keys = [(key.role, key.secret.encode()) for key in keys]

    def role_of(self, authorization: str | None) -> str | None:
        """The role a header's bearer key grants, or None."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        presented = token.strip().encode()
        role = None
        # Compare with every key, not stopping at a match, so timing reveals nothing.
        for key_role, secret in self._keys:
            if hmac.compare_digest(presented, secret) and role is None:
                role = key_role
        return role

    def require(self, request: Request, needed: str) -> None:
        """Raise 401 without a valid key, 403 when its role may not call this."""
        role = self.role_of(request.headers.get("authorization"))
        if role is None:
            raise errors.Unauthorized()
        if needed == "admin" and role != "admin":
            raise errors.Forbidden()
