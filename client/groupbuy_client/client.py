"""A small typed async client of the groupbuy HTTP API, signing requests when told.

```python
async with GroupBuyClient("http://127.0.0.1:8000", key, sign=True) as gb:
    await gb.lock("spring-sale", "team-1", "bob")
```

Every operation of docs/api.md is one method answering the JSON body as a TypedDict; an
error answer raises `GroupBuyAPIError` carrying its problem+json. A request that got no
answer, a 503, or a 429 with `Retry-After` is sent again, a bounded number of times
(groupbuy_client.retries); when the tries run out, no answer raises
`GroupBuyTransportError`, its cause the HTTP library's own exception.
Requests go out on an aiohttp session (httpx's pool fell far behind it under hundreds of
concurrent callers, docs/benchmarks-findings.md), which reads no proxy settings from the
environment (httpx did); an httpx transport handed in replaces the network, e.g. to call
an app in-process. The blocking flavour with the same methods: groupbuy_client.client_sync.
The answers' TypedDicts are the server's own (groupbuy_client.wire, standard library only):
the server depends on this package, never the reverse.
"""

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from yarl import URL

from groupbuy_client.retries import DEFAULT_RETRIES, Retries
from groupbuy_client.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, body_hash, signature
from groupbuy_client.wire import (
    Account,
    ActivitiesPage,
    Activity,
    AuditPage,
    BlockedUser,
    BlockedUsersPage,
    Confirmed,
    DeadLetter,
    DeadLettersPage,
    Dissolved,
    EventsPage,
    Grabbed,
    GrabsPage,
    Health,
    JobReport,
    LedgerEntriesPage,
    LockTaken,
    MemberLeft,
    Packet,
    PacketGrab,
    PacketSent,
    PacketsPage,
    PacketStatus,
    Readiness,
    ReconcileReport,
    Released,
    SplitStrategy,
    Team,
    TeamsPage,
    Unblocked,
    UserLock,
    WaitlistAnswer,
    WaitlistEntry,
    WaitlistRemoved,
    WebhookAttemptsPage,
    WebhookDeleted,
    WebhookDeliveriesPage,
    WebhookEndpoint,
    WebhookEndpointCreated,
    WebhookEndpointsPage,
    WebhookReplayQueued,
    WebhookSecretRotated,
    WebhookTestAttempt,
)

if TYPE_CHECKING:
    import httpx

# -- errors --------------------------------------------------------------------------------

_PROBLEM_FIELDS = ("type", "title", "status", "code", "detail")


class HTTPAnswer(Protocol):
    """What an error is read from: an answer of the client's (or an `httpx.Response`)."""

    @property
    def status_code(self) -> int: ...

    @property
    def reason_phrase(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


class GroupBuyAPIError(Exception):
    """An error answer of the API: its status and problem+json (`code` is what to branch
    on; fields particular to the code, such as `next_unlock_at`, are in `extra`)."""

    def __init__(self, status: int, problem: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        self.status = status
        self.problem = dict(problem)
        self.code = str(problem.get("code", "http_error"))
        self.title = str(problem.get("title", ""))
        self.detail = str(problem.get("detail", ""))
        self.type = str(problem.get("type", "about:blank"))
        self.extra = {k: v for k, v in problem.items() if k not in _PROBLEM_FIELDS}
        self.headers = headers  # case-insensitive, e.g. Retry-After of a 429
        super().__init__(f"{status} {self.code}: {self.detail}")

    @classmethod
    def from_response(cls, response: HTTPAnswer) -> "GroupBuyAPIError":
        """The error of an answer, problem+json or not (a proxy's HTML page, say)."""
        problem: Any = None
        if "json" in response.headers.get("content-type", ""):
            try:
                problem = response.json()
            except ValueError:
                problem = None
        if not isinstance(problem, dict):
            problem = {
                "code": "http_error",
                "detail": response.text[:500] or response.reason_phrase,
            }
        return cls(response.status_code, problem, response.headers)


class GroupBuyTransportError(Exception):
    """No answer came: the connection was refused or broke, or `timeout_s` passed. The
    HTTP library's own exception is the cause (`__cause__`). Whether the server applied
    the request is unknown; sending it again is safe (the API is idempotent)."""


# -- the client's helpers ---------------------------------------------------------------------


def _segment(value: str) -> str:
    """One path segment; anything but an id is escaped (and refused by the server, 422)."""
    return quote(value, safe="")


def _query_value(value: Any) -> str:
    """A query parameter as text: booleans as JSON writes them, the rest as str()."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _target(path: str, params: Mapping[str, Any] | None) -> str:
    """The request target exactly as sent and signed: the path, then `?query` if any."""
    if not params:
        return path
    pairs = [(name, _query_value(value)) for name, value in params.items()]
    return f"{path}?{urlencode(pairs, quote_via=quote)}"


# Tries of a signed request the server refused as a replay of an equal one.
_REPLAY_RETRIES = 3


def _refused_as_replay(response: "_Answer") -> bool:
    """True for 401 bad_signature with reason `replayed`."""
    if response.status_code != 401:
        return False
    try:
        problem = response.json()
    except ValueError:
        return False
    return (
        isinstance(problem, dict)
        and problem.get("code") == "bad_signature"
        and problem.get("reason") == "replayed"
    )


def _drop_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


# -- the wire: one exchange of a request for its whole answer --------------------------------


@dataclass(frozen=True, slots=True)
class _Answer:
    """An answer read whole (an `HTTPAnswer`)."""

    status_code: int
    reason_phrase: str
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return orjson.loads(self.content)


class _Wire(Protocol):
    async def exchange(
        self, method: str, target: str, headers: dict[str, str], content: bytes
    ) -> _Answer: ...

    async def aclose(self) -> None: ...


class _AiohttpWire:
    """Requests over an aiohttp session, made on the first request (a session belongs to
    the event loop it was made in, and warns when made outside one)."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self._base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def exchange(
        self, method: str, target: str, headers: dict[str, str], content: bytes
    ) -> _Answer:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        # encoded=True: the target goes out byte for byte as it was signed.
        url = URL(self._base_url + target, encoded=True)
        try:
            async with self._session.request(
                method, url, data=content or None, headers=headers, allow_redirects=False
            ) as response:
                body = await response.read()
        except (TimeoutError, aiohttp.ClientError) as error:
            raise GroupBuyTransportError(f"{method} {target}: {error!r}") from error
        return _Answer(response.status, response.reason or "", response.headers, body)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _HttpxWire:
    """Requests through an httpx transport (e.g. `httpx.ASGITransport(app)`, in-process)."""

    def __init__(self, base_url: str, transport: "httpx.AsyncBaseTransport", timeout_s: float):
        import httpx  # only callers that hand in an httpx transport need httpx

        self._transport_error = httpx.TransportError
        self._http = httpx.AsyncClient(base_url=base_url, transport=transport, timeout=timeout_s)

    async def exchange(
        self, method: str, target: str, headers: dict[str, str], content: bytes
    ) -> _Answer:
        try:
            response = await self._http.request(method, target, content=content, headers=headers)
        except self._transport_error as error:
            raise GroupBuyTransportError(f"{method} {target}: {error!r}") from error
        return _Answer(
            response.status_code, response.reason_phrase, response.headers, response.content
        )

    async def aclose(self) -> None:
        await self._http.aclose()


def _wire(base_url: str, transport: "httpx.AsyncBaseTransport | None", timeout_s: float) -> _Wire:
    """An aiohttp session (at most 100 connections, aiohttp's default), or the transport."""
    if transport is None:
        return _AiohttpWire(base_url, timeout_s)
    return _HttpxWire(base_url, transport, timeout_s)


# -- the client ----------------------------------------------------------------------------


class GroupBuyClient:
    """The groupbuy API over HTTP: one typed async method per operation.

    `api_key` is the bearer secret; with `sign=True` every request to a `/v1` endpoint is
    also signed with it (`X-Groupbuy-Timestamp`, `X-Groupbuy-Signature`). `transport`, an
    httpx transport, replaces the network (e.g. to call an app in-process); without one,
    requests go out on the module's own pool of connections (see the module's docstring).
    `timeout_s` bounds each try of a request. A request that gets no answer, a 503, or a
    429 with `Retry-After` is sent again as `retries` says (4 tries in all by default,
    with growing, jittered waits; `retries=None` never retries): every call of the API is
    idempotent. Use it as an async context manager, or call `aclose()`.

    Two equal requests signed in one second would carry one signature (the server takes
    the second for a replay), so a repeat is signed with the next second, and a request
    refused as a replay of an equal one (another client with the same key, same second)
    is signed again and resent, up to 3 times. A request repeated many times a second
    runs ahead of the clock, and past the server's skew (300 s) it is refused; vary such
    a request or space it out.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        sign: bool = False,
        transport: "httpx.AsyncBaseTransport | None" = None,
        timeout_s: float = 10.0,
        retries: Retries | None = DEFAULT_RETRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api_key = api_key
        self._retries = retries
        self._rng = random.Random()
        self._bearer = f"Bearer {api_key}"
        self._sign = sign
        self._clock = clock
        # request (method, target, body hash) -> the last timestamp it was signed with
        self._last_stamps: dict[tuple[str, str, str], int] = {}
        self._pruned_at = 0
        self._wire = _wire(base_url, transport, timeout_s)

    async def __aenter__(self) -> "GroupBuyClient":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._wire.aclose()

    # -- operations: health, readiness, metrics, the OpenAPI document (no key) ------------

    async def health(self) -> Health:
        """GET /healthz: the process is up."""
        return cast(Health, await self._json("GET", "/healthz", authenticated=False))

    async def ready(self) -> Readiness:
        """GET /readyz: whether Redis and SQL answer and the scripts are loaded (a 503 `not
        ready` is answered, not raised)."""
        # A 503 is its answer here, not a fault to wait out.
        response = await self._send("GET", "/readyz", authenticated=False, retried=False)
        if response.status_code not in (200, 503):
            raise GroupBuyAPIError.from_response(response)
        return cast(Readiness, response.json())

    async def metrics(self) -> str:
        """GET /metrics: the Prometheus text."""
        response = await self._checked("GET", "/metrics", authenticated=False)
        return response.text

    async def openapi(self) -> dict[str, Any]:
        """GET /openapi.json: the OpenAPI 3.1 document."""
        return cast(dict[str, Any], await self._json("GET", "/openapi.json", authenticated=False))

    # -- activities ----------------------------------------------------------------------

    async def create_activity(
        self,
        activity_id: str,
        *,
        name: str | None = None,
        team_size: int | None = None,
        lock_ttl_s: int | None = None,
        team_deadline_s: int | None = None,
        virtual_min_members: int | None = None,
        teams_per_user: int | None = None,
        open_teams_per_leader: int | None = None,
        starts_at: str | None = None,
        ends_at: str | None = None,
        stock: int | None = None,
        max_hold_s: int | None = None,
        late_confirm: bool | None = None,
        waitlist_max_len: int | None = None,
        waitlist_ttl_s: int | None = None,
        waitlist_offer_ttl_s: int | None = None,
    ) -> Activity:
        """POST /v1/activities (admin): create an activity, or find the same one again.
        `starts_at` and `ends_at` are ISO-8601 UTC text (e.g. 2026-11-21T20:00:00Z)."""
        body = _drop_none(
            {
                "activity_id": activity_id,
                "name": name,
                "team_size": team_size,
                "lock_ttl_s": lock_ttl_s,
                "team_deadline_s": team_deadline_s,
                "starts_at": starts_at,
                "ends_at": ends_at,
                "stock": stock,
                "max_hold_s": max_hold_s,
                "late_confirm": late_confirm,
            }
        )
        if virtual_min_members is not None:
            body["virtual_completion"] = {"min_members": virtual_min_members}
        limits = _drop_none(
            {"teams_per_user": teams_per_user, "open_teams_per_leader": open_teams_per_leader}
        )
        if limits:
            body["limits"] = limits
        waitlist = _drop_none(
            {
                "max_len": waitlist_max_len,
                "ttl_s": waitlist_ttl_s,
                "offer_ttl_s": waitlist_offer_ttl_s,
            }
        )
        if waitlist:
            body["waitlist"] = waitlist
        return cast(Activity, await self._json("POST", "/v1/activities", body))

    async def get_activity(self, activity_id: str) -> Activity:
        """GET /v1/activities/{activity_id}."""
        return cast(Activity, await self._json("GET", self._activity(activity_id)))

    async def update_activity(
        self,
        activity_id: str,
        *,
        name: str | None = None,
        close: bool = False,
        ends_at: str | None = None,
        stock: int | None = None,
    ) -> Activity:
        """PATCH /v1/activities/{activity_id} (admin): rename it, close it (final: no team
        opens and no seat is locked or joined any more), move its end, and/or change its
        stock (raised, or lowered down to the units held: below them, 409 conflict)."""
        body = _drop_none(
            {
                "name": name,
                "status": "closed" if close else None,
                "ends_at": ends_at,
                "stock": stock,
            }
        )
        return cast(Activity, await self._json("PATCH", self._activity(activity_id), body))

    async def list_activities(
        self, *, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> ActivitiesPage:
        """GET /v1/activities: a page of activities (of one status, or all), newest first."""
        params = _drop_none({"status": status, "limit": limit, "cursor": cursor})
        return cast(ActivitiesPage, await self._json("GET", "/v1/activities", params=params))

    # -- teams and seat locks ------------------------------------------------------------

    async def open_team(
        self,
        activity_id: str,
        leader_id: str,
        *,
        team_id: str | None = None,
        order_id: str | None = None,
    ) -> Team:
        """POST .../teams: open a team led by `leader_id` (the server names it if no id)."""
        body = _drop_none({"leader_id": leader_id, "team_id": team_id, "order_id": order_id})
        return cast(Team, await self._json("POST", f"{self._activity(activity_id)}/teams", body))

    async def get_team(self, activity_id: str, team_id: str) -> Team:
        """GET .../teams/{team_id}."""
        return cast(Team, await self._json("GET", self._team(activity_id, team_id)))

    async def list_teams(
        self,
        activity_id: str,
        *,
        status: str | None = None,
        has_free_seats: bool | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> TeamsPage:
        """GET .../teams: a page of the open teams with a free seat, closest to forming first;
        of the full ones (`has_free_seats=False`); or of the formed or failed ones (`status`),
        newest end first."""
        fields = {"status": status, "has_free_seats": has_free_seats}
        params = _drop_none({**fields, "limit": limit, "cursor": cursor})
        path = f"{self._activity(activity_id)}/teams"
        return cast(TeamsPage, await self._json("GET", path, params=params))

    async def join(self, activity_id: str, user_id: str) -> LockTaken:
        """POST .../locks: lock a free seat in the open team closest to forming."""
        path = f"{self._activity(activity_id)}/locks"
        return cast(LockTaken, await self._json("POST", path, {"user_id": user_id}))

    async def lock(self, activity_id: str, team_id: str, user_id: str) -> LockTaken:
        """POST .../teams/{team_id}/locks: hold a free seat of this team for the user."""
        path = f"{self._team(activity_id, team_id)}/locks"
        return cast(LockTaken, await self._json("POST", path, {"user_id": user_id}))

    async def unlock(self, activity_id: str, team_id: str, user_id: str) -> Released:
        """DELETE .../teams/{team_id}/locks/{user_id}: release the user's seat lock."""
        path = f"{self._team(activity_id, team_id)}/locks/{_segment(user_id)}"
        return cast(Released, await self._json("DELETE", path))

    async def extend(self, activity_id: str, team_id: str, user_id: str, hold_s: int) -> LockTaken:
        """PATCH .../teams/{team_id}/locks/{user_id}: the payment is taking longer; the lock
        expires `hold_s` after it was taken (at the team's deadline at the latest)."""
        path = f"{self._team(activity_id, team_id)}/locks/{_segment(user_id)}"
        return cast(LockTaken, await self._json("PATCH", path, {"hold_s": hold_s}))

    async def confirm(
        self, activity_id: str, team_id: str, user_id: str, order_id: str
    ) -> Confirmed:
        """POST .../teams/{team_id}/members: the payment succeeded, the lock becomes a seat."""
        path = f"{self._team(activity_id, team_id)}/members"
        body = {"user_id": user_id, "order_id": order_id}
        return cast(Confirmed, await self._json("POST", path, body))

    async def leave(
        self,
        activity_id: str,
        team_id: str,
        user_id: str,
        order_id: str | None = None,
        reason: str | None = None,
    ) -> MemberLeft:
        """POST .../teams/{team_id}/members/{user_id}/leave: the shop refunded the member; out
        of an open team (`left`), or listed refunded in a formed one (`refunded`)."""
        path = f"{self._team(activity_id, team_id)}/members/{_segment(user_id)}/leave"
        body = _drop_none({"order_id": order_id, "reason": reason})
        return cast(MemberLeft, await self._json("POST", path, body))

    async def current_lock(self, activity_id: str, user_id: str) -> UserLock:
        """GET .../users/{user_id}/lock: the user's unexpired lock (404 no_lock raises)."""
        path = f"{self._activity(activity_id)}/users/{_segment(user_id)}/lock"
        return cast(UserLock, await self._json("GET", path))

    async def wait(
        self, activity_id: str, user_id: str, team_id: str | None = None
    ) -> WaitlistAnswer:
        """POST .../waitlist: a lock now if a seat is free and nobody waits (`status`
        locked), else a place in line (`queued`, 202), or the lock the line gave (`offered`).
        Without `team_id`: wait for any team of the activity."""
        path = f"{self._activity(activity_id)}/waitlist"
        body = _drop_none({"user_id": user_id, "team_id": team_id})
        answer = await self._json("POST", path, body)
        return cast(WaitlistAnswer, answer)

    async def waitlist_entry(self, activity_id: str, user_id: str) -> WaitlistEntry:
        """GET .../waitlist/{user_id}: the place in line, or the offer (404 not_waiting
        raises)."""
        path = f"{self._activity(activity_id)}/waitlist/{_segment(user_id)}"
        return cast(WaitlistEntry, await self._json("GET", path))

    async def leave_waitlist(self, activity_id: str, user_id: str) -> WaitlistRemoved:
        """DELETE .../waitlist/{user_id}: leave the line (an offered lock stays)."""
        path = f"{self._activity(activity_id)}/waitlist/{_segment(user_id)}"
        return cast(WaitlistRemoved, await self._json("DELETE", path))

    # -- accounts and red packets --------------------------------------------------------

    async def deposit(self, user_id: str, amount_cents: int, reference: str) -> Account:
        """POST /v1/accounts/{user_id}/deposits (admin): credit once per reference."""
        path = f"/v1/accounts/{_segment(user_id)}/deposits"
        body = {"amount_cents": amount_cents, "reference": reference}
        return cast(Account, await self._json("POST", path, body))

    async def account(self, user_id: str) -> Account:
        """GET /v1/accounts/{user_id}: the balance (0 for a user never seen)."""
        return cast(Account, await self._json("GET", f"/v1/accounts/{_segment(user_id)}"))

    async def entries(
        self, user_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> LedgerEntriesPage:
        """GET /v1/accounts/{user_id}/entries: a page of the ledger entries, newest first."""
        path = f"/v1/accounts/{_segment(user_id)}/entries"
        params = _drop_none({"limit": limit, "cursor": cursor})
        return cast(LedgerEntriesPage, await self._json("GET", path, params=params))

    async def list_packets(
        self,
        *,
        sender_id: str | None = None,
        status: PacketStatus | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> PacketsPage:
        """GET /v1/redpackets: a page of packets, newest first, of a sender or a status."""
        params = _drop_none(
            {"sender_id": sender_id, "status": status, "limit": limit, "cursor": cursor}
        )
        return cast(PacketsPage, await self._json("GET", "/v1/redpackets", params=params))

    async def send_packet(
        self,
        sender_id: str,
        amount_cents: int,
        count: int,
        *,
        packet_id: str | None = None,
        expires_in_s: int | None = None,
        strategy: SplitStrategy | None = None,
        message: str | None = None,
        recipients: list[str] | None = None,
        password: str | None = None,
        sender_may_grab: bool | None = None,
    ) -> PacketSent:
        """POST /v1/redpackets: send a packet, debiting the sender. `message` is a greeting;
        `recipients` the only users who may grab; `password` what a grab must give;
        `sender_may_grab=False` keeps the sender from grabbing."""
        body = _drop_none(
            {
                "sender_id": sender_id,
                "amount_cents": amount_cents,
                "count": count,
                "packet_id": packet_id,
                "expires_in_s": expires_in_s,
                "strategy": strategy,
                "message": message,
                "recipients": recipients,
                "password": password,
                "sender_may_grab": sender_may_grab,
            }
        )
        return cast(PacketSent, await self._json("POST", "/v1/redpackets", body))

    async def grab(self, packet_id: str, user_id: str, password: str | None = None) -> Grabbed:
        """POST /v1/redpackets/{packet_id}/grab: a share, at most once per user (`password`
        for a packet sent with one; a wrong one raises 403 wrong_password)."""
        body = _drop_none({"user_id": user_id, "password": password})
        return cast(Grabbed, await self._json("POST", f"{self._packet(packet_id)}/grab", body))

    async def withdraw_packet(self, packet_id: str, sender_id: str) -> Packet:
        """POST /v1/redpackets/{packet_id}/withdraw: the sender takes back what is left; the
        packet ends `withdrawn` (once: a repeat answers the same; 409 packet_ended when it
        sold out or expired first)."""
        path = f"{self._packet(packet_id)}/withdraw"
        return cast(Packet, await self._json("POST", path, {"sender_id": sender_id}))

    async def get_packet(self, packet_id: str) -> Packet:
        """GET /v1/redpackets/{packet_id}: the packet and its first 100 grabs."""
        return cast(Packet, await self._json("GET", self._packet(packet_id)))

    async def packet_grabs(
        self, packet_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> GrabsPage:
        """GET /v1/redpackets/{packet_id}/grabs: a page of the grabs, in grab order (the
        packet's `grabs_next_cursor` as `cursor` reads on after its first 100)."""
        params = _drop_none({"limit": limit, "cursor": cursor})
        path = f"{self._packet(packet_id)}/grabs"
        return cast(GrabsPage, await self._json("GET", path, params=params))

    async def packet_grab(self, packet_id: str, user_id: str) -> PacketGrab:
        """GET /v1/redpackets/{packet_id}/grabs/{user_id}: one user's grab (404 not_grabbed
        raises)."""
        path = f"{self._packet(packet_id)}/grabs/{_segment(user_id)}"
        return cast(PacketGrab, await self._json("GET", path))

    @staticmethod
    def _packet(packet_id: str) -> str:
        return f"/v1/redpackets/{_segment(packet_id)}"

    # -- events and administration -------------------------------------------------------

    async def events(self, *, after: int = 0, limit: int | None = None) -> EventsPage:
        """GET /v1/events: events with ids above `after`, in id order."""
        params = _drop_none({"after": after, "limit": limit})
        return cast(EventsPage, await self._json("GET", "/v1/events", params=params))

    async def run_job(self, name: str) -> JobReport:
        """POST /v1/admin/jobs/{name}/run (admin): run a scheduled job now; its report."""
        path = f"/v1/admin/jobs/{_segment(name)}/run"
        return cast(JobReport, await self._json("POST", path))

    async def reconcile_report(self) -> ReconcileReport:
        """GET /v1/admin/reconcile (admin): the last reconciliation report."""
        return cast(ReconcileReport, await self._json("GET", "/v1/admin/reconcile"))

    async def dissolve_team(self, activity_id: str, team_id: str, reason: str) -> Dissolved:
        """POST /v1/admin/activities/{activity_id}/teams/{team_id}/dissolve (admin): fail an
        open team now (`reason` dissolved); its members are the refund list."""
        path = f"/v1/admin/activities/{_segment(activity_id)}/teams/{_segment(team_id)}/dissolve"
        return cast(Dissolved, await self._json("POST", path, {"reason": reason}))

    async def block_user(self, user_id: str, reason: str | None = None) -> BlockedUser:
        """PUT /v1/admin/blocked-users/{user_id} (admin): the user's seat locks, joins, grabs
        and sends are refused with 403 user_blocked from now on."""
        path = f"/v1/admin/blocked-users/{_segment(user_id)}"
        body = _drop_none({"reason": reason})
        return cast(BlockedUser, await self._json("PUT", path, body=body))

    async def unblock_user(self, user_id: str) -> Unblocked:
        """DELETE /v1/admin/blocked-users/{user_id} (admin): lift a block."""
        path = f"/v1/admin/blocked-users/{_segment(user_id)}"
        return cast(Unblocked, await self._json("DELETE", path))

    async def blocked_users(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> BlockedUsersPage:
        """GET /v1/admin/blocked-users (admin): a page of the blocked users."""
        params = _drop_none({"limit": limit, "cursor": cursor})
        return cast(
            BlockedUsersPage, await self._json("GET", "/v1/admin/blocked-users", params=params)
        )

    async def dead_letters(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> DeadLettersPage:
        """GET /v1/admin/dead-letters (admin): records the write-behind could not apply."""
        params = _drop_none({"limit": limit, "cursor": cursor})
        return cast(
            DeadLettersPage, await self._json("GET", "/v1/admin/dead-letters", params=params)
        )

    async def audit(self, *, limit: int | None = None, cursor: str | None = None) -> AuditPage:
        """GET /v1/admin/audit (admin or viewer): a page of the audit log, newest first."""
        params = _drop_none({"limit": limit, "cursor": cursor})
        return cast(AuditPage, await self._json("GET", "/v1/admin/audit", params=params))

    async def replay_dead_letter(self, dead_letter_id: int) -> DeadLetter:
        """POST /v1/admin/dead-letters/{id}/replay (admin): apply a dead letter once its cause
        is fixed (409 replay_failed while it still fails)."""
        path = f"/v1/admin/dead-letters/{int(dead_letter_id)}/replay"
        return cast(DeadLetter, await self._json("POST", path))

    async def create_webhook(
        self,
        endpoint_id: str,
        url: str,
        event_types: list[str],
        *,
        description: str | None = None,
        ordering: str | None = None,
    ) -> WebhookEndpointCreated:
        """POST /v1/admin/webhooks (admin): register an endpoint; keep the `secret` of the
        answer (shown once) to verify its deliveries."""
        body = _drop_none(
            {
                "endpoint_id": endpoint_id,
                "url": url,
                "event_types": event_types,
                "description": description,
                "ordering": ordering,
            }
        )
        return cast(WebhookEndpointCreated, await self._json("POST", "/v1/admin/webhooks", body))

    async def webhooks(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> WebhookEndpointsPage:
        """GET /v1/admin/webhooks (admin): a page of endpoints."""
        params = _drop_none({"limit": limit, "cursor": cursor})
        return cast(
            WebhookEndpointsPage, await self._json("GET", "/v1/admin/webhooks", params=params)
        )

    async def get_webhook(self, endpoint_id: str) -> WebhookEndpoint:
        """GET /v1/admin/webhooks/{endpoint_id} (admin)."""
        return cast(WebhookEndpoint, await self._json("GET", self._webhook(endpoint_id)))

    async def update_webhook(self, endpoint_id: str, **changes: Any) -> WebhookEndpoint:
        """PATCH /v1/admin/webhooks/{endpoint_id} (admin): change `url`, `event_types`,
        `description` or `disabled` (false enables it again: what waited is delivered)."""
        path = self._webhook(endpoint_id)
        return cast(WebhookEndpoint, await self._json("PATCH", path, body=changes))

    async def delete_webhook(self, endpoint_id: str) -> WebhookDeleted:
        """DELETE /v1/admin/webhooks/{endpoint_id} (admin)."""
        return cast(WebhookDeleted, await self._json("DELETE", self._webhook(endpoint_id)))

    async def rotate_webhook_secret(self, endpoint_id: str) -> WebhookSecretRotated:
        """POST /v1/admin/webhooks/{endpoint_id}/secret/rotate (admin): a new secret; the old
        one signs beside it until `previous_secret_expires_at`."""
        path = f"{self._webhook(endpoint_id)}/secret/rotate"
        return cast(WebhookSecretRotated, await self._json("POST", path))

    async def webhook_deliveries(
        self,
        endpoint_id: str,
        *,
        status: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> WebhookDeliveriesPage:
        """GET /v1/admin/webhooks/{endpoint_id}/deliveries (admin): newest first."""
        params = _drop_none({"status": status, "limit": limit, "cursor": cursor})
        path = f"{self._webhook(endpoint_id)}/deliveries"
        return cast(WebhookDeliveriesPage, await self._json("GET", path, params=params))

    async def webhook_attempts(
        self,
        endpoint_id: str,
        webhook_id: str,
        *,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> WebhookAttemptsPage:
        """GET /v1/admin/webhooks/{endpoint_id}/deliveries/{webhook_id}/attempts (admin):
        one delivery's attempts, newest first; a delivery's `older_attempts_cursor` as
        `cursor` reads on from its page."""
        params = _drop_none({"limit": limit, "cursor": cursor})
        path = f"{self._webhook(endpoint_id)}/deliveries/{_segment(webhook_id)}/attempts"
        return cast(WebhookAttemptsPage, await self._json("GET", path, params=params))

    async def replay_webhook(
        self, endpoint_id: str, after: int, until: int | None = None
    ) -> WebhookReplayQueued:
        """POST /v1/admin/webhooks/{endpoint_id}/replay (admin): queue the feed's events
        `after < id <= until` again (202)."""
        path = f"{self._webhook(endpoint_id)}/replay"
        body = _drop_none({"after": after, "until": until})
        return cast(WebhookReplayQueued, await self._json("POST", path, body=body))

    async def test_webhook(self, endpoint_id: str) -> WebhookTestAttempt:
        """POST /v1/admin/webhooks/{endpoint_id}/test (admin): send a `webhook.test` now."""
        path = f"{self._webhook(endpoint_id)}/test"
        return cast(WebhookTestAttempt, await self._json("POST", path))

    @staticmethod
    def _webhook(endpoint_id: str) -> str:
        return f"/v1/admin/webhooks/{_segment(endpoint_id)}"

    # -- the wire ------------------------------------------------------------------------

    @staticmethod
    def _activity(activity_id: str) -> str:
        return f"/v1/activities/{_segment(activity_id)}"

    def _team(self, activity_id: str, team_id: str) -> str:
        return f"{self._activity(activity_id)}/teams/{_segment(team_id)}"

    async def _json(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        params: Mapping[str, Any] | None = None,
        authenticated: bool = True,
    ) -> Any:
        response = await self._checked(method, path, body, params, authenticated)
        return response.json()

    async def _checked(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        authenticated: bool = True,
    ) -> _Answer:
        response = await self._send(method, path, body, params, authenticated)
        if response.status_code >= 400:
            raise GroupBuyAPIError.from_response(response)
        return response

    async def _send(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        authenticated: bool = True,
        retried: bool = True,
    ) -> _Answer:
        """The answer of a request, sent again as `retries` allows (see groupbuy_client.retries)."""
        headers: dict[str, str] = {}
        content = b""
        if body is not None:
            content = orjson.dumps(body)
            headers["Content-Type"] = "application/json"
        if authenticated:
            headers["Authorization"] = self._bearer
        target = _target(path, params)
        signed = authenticated and self._sign
        retries = self._retries if retried else None
        attempt = 1
        while True:
            try:
                response = await self._send_once(method, target, headers, content, signed)
            except GroupBuyTransportError:
                wait = retries.wait_after_no_answer(attempt, self._rng) if retries else None
                if wait is None:
                    raise
            else:
                wait = (
                    retries.wait_after_answer(
                        attempt, response.status_code, response.headers, self._rng
                    )
                    if retries
                    else None
                )
                if wait is None:
                    return response
            await asyncio.sleep(wait)
            attempt += 1

    async def _send_once(
        self, method: str, target: str, headers: dict[str, str], content: bytes, signed: bool
    ) -> _Answer:
        if not signed:
            return await self._wire.exchange(method, target, headers, content)
        for _ in range(_REPLAY_RETRIES):
            self._sign_request(method, target, headers, content)
            response = await self._wire.exchange(method, target, headers, content)
            if not _refused_as_replay(response):
                return response
            # An equal request signed in the same second by another client with this key
            # was there first; nothing of this one was applied. Signed again, it carries a
            # later timestamp (_timestamp moves on) and so another signature.
        return response

    def _sign_request(
        self, method: str, target: str, headers: dict[str, str], content: bytes
    ) -> None:
        stamp = self._timestamp((method, target, body_hash(content)))
        headers[TIMESTAMP_HEADER] = stamp
        headers[SIGNATURE_HEADER] = signature(
            self._api_key, method, target.encode(), stamp, content
        )

    def _timestamp(self, request: tuple[str, str, str]) -> str:
        """Now in Unix seconds, or one second past the last time this very request was
        signed: two equal requests in one second would carry one signature, and the
        server refuses the second as a replay."""
        now = int(self._clock())
        if now > self._pruned_at:
            # Once a second: a stamp in the past can no longer collide with a new one.
            self._pruned_at = now
            self._last_stamps = {k: v for k, v in self._last_stamps.items() if v >= now}
        stamp = max(now, self._last_stamps.get(request, now - 1) + 1)
        self._last_stamps[request] = stamp
        return str(stamp)
