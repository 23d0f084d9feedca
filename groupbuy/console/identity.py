"""Who is signed in to the console: sign-in with an API key, the session it leaves, CSRF
tokens bound to that session, and the `next` address a sign-in returns to."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from groupbuy.api.access import Authenticator
from groupbuy.settings import Settings
from groupbuy.storage.keys import Keys

HOME = "/console"
SIGN_IN = "/console/signin"
# The roles that may sign in: admin acts, viewer reads; service keys are for the backend.
CONSOLE_ROLES = ("admin", "viewer")
_SECRET_CONTEXT = b"groupbuy console session v1"


def session_secret(settings: Settings) -> str:
    """The key that signs session cookies: `[console] secret`, else an HMAC of the API keys
    (the same in every worker of one serve and across restarts with the same keys)."""
    if settings.console.secret:
        return settings.console.secret
    material = "\n".join(sorted(settings.auth.api_keys)).encode()
    return hmac.new(_SECRET_CONTEXT, material, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Operator:
    """A signed-in operator: the role of the key used, the key's fingerprint, and the id of
    the session (kept in Redis while it lasts)."""

    role: str
    fingerprint: str
    session: str = ""

    @property
    def actor(self) -> str:
        """How the audit log names this operator (never the secret)."""
        return f"{self.role}:{self.fingerprint}"

    @property
    def may_act(self) -> bool:
        """Only admins change things; viewers read."""
        return self.role == "admin"


class Gate:
    """Signs operators in with an admin or viewer key, finds the operator of a request, and
    signs them out. A session is a signed cookie naming a session id that Redis keeps for
    the session's lifetime: sign-out deletes it, so a copy of the cookie signs nobody in,
    in any process."""

    def __init__(
        self,
        auth: Authenticator,
        settings: Settings,
        redis: Any,
        keys: Keys,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._auth = auth
        self._configured = [key for key in settings.auth.keys if key.role in CONSOLE_ROLES]
        self._known: set[tuple[str, str]] | None = None
        self._max_age_s = settings.console.session_max_age_s
        self._redis = redis
        self._keys = keys
        self._clock = clock

    async def _known_keys(self) -> set[tuple[str, str]]:
        """(role, fingerprint) of every key that may sign in."""
        if self._known is None:
            self._known = {(key.role, await self._auth.key_id(key)) for key in self._configured}
        return self._known

    async def sign_in(self, request: Request, secret: str) -> Operator | str:
        """Start a session for the key `secret`, or say why not (a sentence to show)."""
        key = self._auth.key_of(f"Bearer {secret}") if secret.strip() else None
        if key is None:
            return "That key is not valid."
        if key.role not in CONSOLE_ROLES:
            return "A service key cannot sign in to the console: use an admin or viewer key."
        operator = Operator(key.role, await self._auth.key_id(key), secrets.token_urlsafe(24))
        await self._redis.set(
            self._keys.console_session(operator.session), operator.actor, ex=self._max_age_s
        )
        # A new session (and CSRF token) at each sign-in: nothing set before it carries over.
        request.session.clear()
        request.session.update(
            role=operator.role,
            key=operator.fingerprint,
            sid=operator.session,
            at=int(self._clock()),
            csrf=secrets.token_urlsafe(32),
        )
        return operator

    async def operator(self, request: Request) -> Operator | None:
        """The request's operator, or None: no session, a key no longer configured, a
        sign-in older than `[console] session_max_age_s`, or a session signed out."""
        session: Mapping[str, Any] = request.session
        role, fingerprint, at = session.get("role"), session.get("key"), session.get("at")
        sid = session.get("sid")
        if not (
            isinstance(role, str)
            and isinstance(fingerprint, str)
            and isinstance(at, int)
            and isinstance(sid, str)
            and sid
        ):
            return None
        if role not in CONSOLE_ROLES or (role, fingerprint) not in await self._known_keys():
            return None
        if self._clock() - at > self._max_age_s:
            return None
        if not await self.signed_in(sid):
            return None  # signed out (or Redis lost its sessions: sign in again)
        return Operator(role, fingerprint, sid)

    async def signed_in(self, sid: str) -> bool:
        """Whether the session `sid` has not been signed out (in any process)."""
        return bool(await self._redis.exists(self._keys.console_session(sid)))

    async def sign_out(self, request: Request) -> None:
        """End the request's session on the server, then forget the cookie's content."""
        sid = request.session.get("sid")
        if isinstance(sid, str) and sid:
            await self._redis.delete(self._keys.console_session(sid))
        request.session.clear()


def secure_cookie(settings: Settings) -> bool:
    """Whether the session cookie carries `Secure`: `[console] https_only` when set, else
    whenever the service listens beyond loopback (a browser then reaches it over a network,
    where the cookie must travel only over HTTPS)."""
    chosen = settings.console.https_only
    if chosen is not None:
        return chosen
    host = settings.server.host
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name other than localhost: reached over the network


def csrf_token(request: Request) -> str:
    """The session's CSRF token (made for a signed-out visitor too: the sign-in form)."""
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


def csrf_ok(request: Request, presented: object) -> bool:
    """True when a form's token is the one of this session."""
    token = request.session.get("csrf")
    if not isinstance(token, str) or not isinstance(presented, str):
        return False
    return hmac.compare_digest(token.encode(), presented.encode())


def safe_next(value: object) -> str:
    """`value` when it is a console address of this site, else the overview: a sign-in
    never sends the browser elsewhere (no open redirect)."""
    if not isinstance(value, str) or not value.startswith(HOME):
        return HOME
    rest = value[len(HOME) :]
    if rest and rest[0] not in "/?":
        return HOME
    if "//" in value or "\\" in value or any(ord(char) < 0x21 for char in value):
        return HOME
    return value
