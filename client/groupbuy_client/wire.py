"""The shapes of the API's answers on the wire, each written once, as a TypedDict.

The services build their answers to these shapes, the typed client (groupbuy_client.client)
returns them, and the OpenAPI document describes them (groupbuy.api.answers derives its
models from them). How a time is written on the wire (`iso_ms`) and what a create
answers (`Outcome`: the body, and whether this call created it) sit here too. This module
imports only the standard library, so the client can depend on it alone.

A field's documentation and constraints ride in `Annotated`: a plain string is its
description, `Ge` a number's lower bound, `Pattern` a string's regular expression. A
`NotRequired` field is absent from some answers. To add a field to an answer, add it
here and to the function that builds the answer.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired[...] from the
# evaluated annotations on Python 3.11.
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any, Literal, NotRequired, TypedDict, TypeVar, overload


@dataclass(frozen=True, slots=True)
class Ge:
    """A number's lower bound (JSON Schema's `minimum`)."""

    value: int


@dataclass(frozen=True, slots=True)
class Pattern:
    """A regular expression a string matches (JSON Schema's `pattern`)."""

    regex: str


@dataclass(frozen=True, slots=True)
class OneOf:
    """A union of shapes told apart by the value of one field (`tag`)."""

    tag: str


_Shape = TypeVar("_Shape")


def extensible(shape: _Shape) -> _Shape:
    """Marks a shape whose answers may carry fields beyond those listed."""
    setattr(shape, "__extensible__", True)  # noqa: B010 (a TypedDict has no attributes)
    return shape


def is_extensible(shape: object) -> bool:
    """True for a shape marked by `extensible`."""
    return bool(getattr(shape, "__extensible__", False))


ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
Id = Annotated[str, Pattern(ID_PATTERN)]
"""An id of the API: an activity, team, user, order, packet or endpoint."""

TIMESTAMP_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$"
Timestamp = Annotated[str, Pattern(TIMESTAMP_PATTERN)]
"""ISO-8601 UTC with milliseconds, e.g. 2026-11-21T17:42:51.123Z."""


# -- times: epoch ms (Redis's clock), ISO-8601 text (the wire), aware datetimes (SQL) ------


@overload
def iso_ms(ms: int) -> str: ...
@overload
def iso_ms(ms: None) -> None: ...
@overload
def iso_ms(ms: int | None) -> str | None: ...
def iso_ms(ms: int | None) -> str | None:
    """`1763746971123` -> `2025-11-21T17:42:51.123Z`; None stays None."""
    if ms is None:
        return None
    seconds, millis = divmod(ms, 1000)
    return f"{_iso_second(seconds)}{millis:03d}Z"


@lru_cache(maxsize=4096)
def _iso_second(seconds: int) -> str:
    # Answers given in the same second share this part; strftime was a hot spot under load.
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")


def to_ms(moment: datetime) -> int:
    """A datetime (naive means UTC, as SQLite returns it) to epoch milliseconds."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    """Epoch milliseconds to an aware UTC datetime for SQL columns."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass(frozen=True)
class Outcome:
    """A create's answer: 201 when this call created it, 200 when it found the same thing."""

    body: Mapping[str, Any]
    created: bool


SplitStrategy = Literal["double_mean", "equal"]
"""How a packet's amount is split into shares: each name is one function of
groupbuy/redpacket/split.py (SPLITS), which a test holds to this list."""
PacketStatus = Literal["active", "sold_out", "expired", "withdrawn"]
"""A packet's status as the API names it (SQL's `pending` is shown `active`)."""
EntryKind = Literal["deposit", "send", "grab", "refund"]
"""A ledger entry's kind in the API's words."""
TeamStatus = Literal["open", "formed", "failed"]
"""A team's status: open until its last seat is confirmed (formed) or its deadline passes."""
SaleStatus = Literal["scheduled", "open", "ended", "closed"]
"""An activity's status: its sale as judged on Redis's clock, or closed by an admin."""

# Attempts a delivery shows in the page of deliveries: its newest (a delivery retried for
# days, or replayed, has many); the rest are read with `attempts`.
ATTEMPTS_SHOWN = 10


_NEXT_CURSOR = "pass it as `cursor` for the next page; null after the last page"


# -- the process ---------------------------------------------------------------------------


class Health(TypedDict):
    """The process is up."""

    status: Literal["ok"]


class Readiness(TypedDict):
    """Whether Redis and SQL answer and the Lua scripts are loaded."""

    status: Literal["ready", "not ready"]
    checks: Annotated[dict[str, str], "redis, scripts, database: `ok` or what is wrong with each"]


@extensible
class OpenApiDocument(TypedDict):
    """An OpenAPI 3.1 document (https://spec.openapis.org/oas/v3.1.0)."""

    openapi: Annotated[str, Pattern(r"^3\.1\.\d+$")]
    info: dict[str, Any]
    paths: dict[str, dict[str, Any]]
    components: dict[str, Any]


# -- events, jobs and reconciliation -------------------------------------------------------


class Event(TypedDict):
    """One recorded event."""

    id: Annotated[
        int,
        "increasing, given once the event is committed (an event that commits "
        "later gets a higher id, never one below a cursor already passed); pass the last "
        "one seen as `after`",
    ]
    type: Annotated[str, "one of the event types of docs/api.md#event-types"]
    at: Annotated[Timestamp, "when it took effect"]
    data: Annotated[
        dict[str, Any],
        "the ids and amounts the event concerns, and `version`: its team's or "
        "packet's version after the change (drop an event whose version is not newer than "
        "the one you hold); `team.formed` also has `virtual_seats` (seats counted as filled "
        "by virtual completion, 0 for a team that filled up)",
    ]


class EventsPage(TypedDict):
    """A page of the events feed."""

    events: list[Event]
    next_after: Annotated[int, "the `after` of the next page"]


class ReconcileReport(TypedDict):
    """A reconciliation run: what it checked and every mismatch found twice."""

    id: int
    started_at: Timestamp
    finished_at: Timestamp
    since: Annotated[Timestamp | None, "start of the previous run; null on the first"]
    packets_checked: int
    teams_checked: int
    accounts_checked: int
    pending_records: Annotated[int, "records still in outbox streams (not compared)"]
    mismatch_count: int
    mismatches: Annotated[list[dict[str, Any]], "the first 1000, each with its `kind`"]


class _JobRun(TypedDict):
    """What every job report starts with."""

    duration_ms: Annotated[float, "how long the run took"]


class TeamSweepReport(_JobRun):
    """A run of sweep_locks (expired seat locks) or expire_teams (passed deadlines)."""

    job: Literal["sweep_locks", "expire_teams"]
    activities: Annotated[int, "activities whose due index was read"]
    teams: Annotated[int, "teams the run looked at"]
    locks_expired: int
    teams_failed: Annotated[int, "teams this run ended as failed"]
    teams_formed_virtually: Annotated[int, "teams this run formed by virtual completion"]
    waitlist_expired: Annotated[int, "waitlist entries whose time ran out (sweep_locks)"]


class ExpirePacketsReport(_JobRun):
    """A run of expire_packets."""

    job: Literal["expire_packets"]
    due: Annotated[int, "packets whose time was over"]
    expired: Annotated[int, "packets this run expired (and refunded)"]


class FlushRecordsReport(_JobRun):
    """A run of flush_records, the write-behind from Redis to SQL."""

    job: Literal["flush_records"]
    team_records: Annotated[int, "team records written to SQL"]
    packet_records: Annotated[int, "packet records written to SQL"]
    complete: Annotated[
        bool,
        "false when a scheduled run's time ran out and left records for the next "
        "run (a run by hand writes everything waiting)",
    ]
    backlog: Annotated[int, "records still waiting in Redis afterwards"]
    lag_s: Annotated[float, "age of the oldest waiting record, in seconds"]


class RepairReport(_JobRun):
    """A run of repair."""

    job: Literal["repair"]
    pending: Annotated[int, "sends whose Redis step had not happened"]
    made_live: Annotated[int, "of those, packets created in Redis now"]
    refunded: Annotated[int, "of those, packets already over: refunded"]
    teams_released: Annotated[int, "ended teams removed from Redis (recorded in SQL)"]
    activities_released: Annotated[int, "activities with no live team left in Redis"]
    activities_reindexed: int
    teams_restored: Annotated[int, "live teams rebuilt in Redis from SQL"]
    packets_released: Annotated[int, "ended packets removed from Redis"]
    packets_reindexed: int
    packets_restored: Annotated[int, "live packets rebuilt in Redis from SQL"]
    blocked_users: Annotated[int, "users on the admin blocklist (SQL's count)"]
    blocklist_rebuilt: Annotated[
        int,
        "Redis's copies of the blocklist that differed from SQL and were rebuilt "
        "(one on one Redis server; in Redis Cluster also one per slot in use)",
    ]


class ReconcileRunReport(ReconcileReport):
    """A run of reconcile: its stored report (as GET /v1/admin/reconcile answers it)."""

    job: Literal["reconcile"]
    duration_ms: Annotated[float, "how long the run took"]


JobReport = Annotated[
    TeamSweepReport | ExpirePacketsReport | FlushRecordsReport | RepairReport | ReconcileRunReport,
    OneOf(tag="job"),
    "What a job run did: the report of the job named by `job`.",
]


class DeadLetter(TypedDict):
    """An outbox record SQL could not apply, kept instead of dropped."""

    id: Annotated[int, "the dead letter's id (pages follow it)"]
    stream: Annotated[
        Literal["packets", "teams"],
        "which write-behind held it: a packet's grabs and endings, or an activity's team records",
    ]
    owner_id: Annotated[str, "the packet id or activity id whose outbox held it"]
    entry_id: Annotated[str, "its id in that Redis stream"]
    fields: Annotated[dict[str, str], "the record as the script wrote it"]
    error: Annotated[str, "why SQL could not apply it"]
    dead_at: Annotated[Timestamp, "when it was moved to the dead letters"]
    replayed_at: Annotated[
        Timestamp | None,
        "when an operator replayed it into SQL (POST .../replay); null until then",
    ]


class DeadLettersPage(TypedDict):
    """A page of dead letters, oldest first."""

    dead_letters: list[DeadLetter]
    next_cursor: Annotated[str | None, _NEXT_CURSOR]


# -- activities, teams and seat locks ------------------------------------------------------


class VirtualCompletionRule(TypedDict):
    """An activity's virtual completion (模拟成团)."""

    min_members: int


class ActivityLimitsRule(TypedDict):
    """An activity's per-user limits (null: no limit of that kind)."""

    teams_per_user: int | None
    open_teams_per_leader: int | None


class WaitlistRules(TypedDict):
    """An activity's waitlist: how many may wait, for how long, how long an offer lives."""

    max_len: Annotated[int, Ge(1), "entries in the activity's lines at most (409 waitlist_full)"]
    ttl_s: Annotated[int, Ge(1), "an entry leaves the line this long after it queued"]
    offer_ttl_s: Annotated[int, Ge(1), "the lifetime of a lock the line offers"]


class Activity(TypedDict):
    """An activity, the parameters its teams take, and its live counts."""

    activity_id: Id
    name: str | None
    team_size: int
    lock_ttl_s: int
    team_deadline_s: int
    virtual_completion: Annotated[
        VirtualCompletionRule | None,
        "at the deadline a team with at least min_members real members is formed "
        "(its missing seats counted as virtual_seats) instead of failed",
    ]
    limits: Annotated[
        ActivityLimitsRule | None,
        "per-user limits; past one, opening, locking or confirming answers 409 user_limit_reached",
    ]
    created_at: Timestamp
    status: Annotated[
        SaleStatus,
        "judged on Redis's clock. `closed`: an admin ended the sale early; no team opens, no "
        "seat is locked or joined (409 activity_closed), teams already open run to their "
        "deadline. Else `ended` from `ends_at` on (409 activity_ended), `scheduled` before "
        "`starts_at` (409 activity_not_started), otherwise `open`",
    ]
    starts_at: NotRequired[Annotated[Timestamp, "when the sale opens; absent: at creation"]]
    ends_at: NotRequired[Annotated[Timestamp, "when the sale ends; absent: until closed"]]
    stock: NotRequired[Annotated[int, Ge(1), "the units the activity may sell; absent: no cap"]]
    stock_left: NotRequired[
        Annotated[
            int,
            Ge(0),
            "units neither held by a member of an open or formed team nor by a live lock; "
            "only with `stock`",
        ]
    ]
    stock_held_by_locks: NotRequired[
        Annotated[int, Ge(0), "units held by live seat locks now; only with `stock`"]
    ]
    max_hold_s: Annotated[int, Ge(1), "the longest a seat lock may be held (lock_ttl_s unless set)"]
    late_confirm: Annotated[
        bool, "a confirm after its lock expired still joins while a seat and a unit are free"
    ]
    waitlist: WaitlistRules
    waiting: Annotated[int, Ge(0), "entries waiting in the activity's lines now"]
    waiting_any_team: Annotated[int, Ge(0), "of those, entries waiting for any team"]
    oldest_waiting_since: Annotated[
        Timestamp | None, "when the entry waiting longest queued; null: nobody waits"
    ]
    teams_open: Annotated[int, Ge(0), "teams open now (a team past its deadline is not)"]
    teams_formed: Annotated[int, Ge(0), "teams formed, virtual completions included"]
    teams_failed: Annotated[int, Ge(0), "teams that failed at their deadline"]
    members: Annotated[int, Ge(0), "members of open and formed teams, leaders included"]
    live_locks: Annotated[int, Ge(0), "seat locks not expired now"]
    virtual_completions: Annotated[
        int, Ge(0), "teams formed by virtual completion at their deadline"
    ]


class ActivitiesPage(TypedDict):
    """A page of activities, newest first."""

    activities: list[Activity]
    next_cursor: Annotated[str | None, _NEXT_CURSOR]


class Member(TypedDict):
    """A member of a team, in joining order."""

    user_id: Id
    order_id: Id | None
    joined_at: Timestamp
    refunded_at: NotRequired[
        Annotated[
            Timestamp,
            "present only for a member of a formed team the shop refunded (POST "
            ".../members/{user_id}/leave): still listed, its stock unit given back",
        ]
    ]


class SeatLock(TypedDict):
    """An unexpired seat lock, oldest first."""

    user_id: Id
    locked_at: Timestamp
    expires_at: Timestamp


class Team(TypedDict):
    """A team; while open, len(members) + len(locks) + free_seats == size."""

    activity_id: Id
    team_id: Id
    leader_id: Id
    status: TeamStatus
    size: int
    members: list[Member]
    locks: Annotated[list[SeatLock], "never an expired lock; empty once ended"]
    free_seats: Annotated[int, "0 once the team is formed or failed"]
    next_unlock_at: Annotated[Timestamp | None, "when the earliest lock expires"]
    deadline_at: Annotated[Timestamp, "an open team fails at this time"]
    formed_at: Timestamp | None
    failed_at: Timestamp | None
    virtual_seats: Annotated[
        int, "seats counted as filled when the team was formed by virtual completion"
    ]
    version: Annotated[
        int,
        "counts the team's changes (open, each lock, unlock, lock expiry, member, "
        "formed, failed); a body or event with a larger version is newer",
    ]


class LockTaken(TypedDict):
    """A seat lock held for a user."""

    status: Literal["locked"]
    user_id: Id
    team_id: Id
    locked_at: Timestamp
    expires_at: Timestamp
    released_team_id: Annotated[
        Id | None,
        "the team of this activity whose lock was released to allow this one "
        "(null when joining any team: a live lock is the answer there)",
    ]
    version: Annotated[int, "the team's version after this lock"]
    existing: NotRequired[
        Annotated[Literal[True], "present (true) only when the lock already existed"]
    ]


class WaitlistQueued(TypedDict):
    """A user waiting in an activity's line for the next free seat."""

    status: Literal["queued"]
    user_id: Id
    team_id: Annotated[Id | None, "the team waited for; null: any team of the activity"]
    position: Annotated[int, "1 is next: the next seat this line can take is offered to 1"]
    queued_at: Timestamp
    expires_at: Annotated[Timestamp, "the entry leaves the line then (waitlist.expired)"]


class WaitlistOffered(TypedDict):
    """The seat lock the line gave a user (the event lock.offered said so too)."""

    status: Literal["offered"]
    user_id: Id
    team_id: Id
    locked_at: Timestamp
    expires_at: Annotated[Timestamp, "confirm (POST .../members) before this"]
    version: Annotated[int, "the team's version after the offer"]
    queued_at: Annotated[Timestamp, "when the entry the offer ended queued"]


WaitlistAnswer = Annotated[
    LockTaken | WaitlistQueued | WaitlistOffered,
    OneOf(tag="status"),
    "A seat lock now (`locked`), a place in line (`queued`) or the lock the line gave (`offered`).",
]
WaitlistEntry = Annotated[
    WaitlistQueued | WaitlistOffered,
    OneOf(tag="status"),
    "A place in line (`queued`) or the lock the line gave (`offered`).",
]


class WaitlistRemoved(TypedDict):
    """The answer of DELETE .../waitlist/{user_id}."""

    removed: Annotated[bool, "true: the entry left the line; false: the user was not waiting"]


class TeamsPage(TypedDict):
    """A page of an activity's teams: open ones closest to forming first, formed or failed
    ones newest end first."""

    teams: list[Team]
    next_cursor: Annotated[str | None, _NEXT_CURSOR]


class Released(TypedDict):
    """Whether a lock was released."""

    released: Annotated[bool, "false when the user held no lock on the team"]


class Confirmed(TypedDict):
    """A confirmed member's team."""

    team: Team
    formed: Annotated[bool, "the team is formed (this confirm or an earlier one)"]
    late: NotRequired[
        Annotated[Literal[True], "joined without a live lock (late confirm); absent otherwise"]
    ]


class MemberLeft(TypedDict):
    """A member's leave: out of an open team (`left`), or refunded in a formed one
    (`refunded`); the team after it."""

    team: Team
    left: NotRequired[
        Annotated[
            Literal[True],
            "present (true) when the member left an open team: no longer listed, the seat "
            "and its stock unit free at once",
        ]
    ]
    refunded: NotRequired[
        Annotated[
            Literal[True],
            "present (true) when the team was formed: it stays formed and lists the member "
            "with `refunded_at`",
        ]
    ]


class Dissolved(TypedDict):
    """A team an admin dissolved: failed now, `reason` dissolved; its members are the
    refund list."""

    team: Team
    dissolved: Literal[True]


class UserLock(TypedDict):
    """A user's current lock in an activity."""

    team_id: Id
    locked_at: Timestamp
    expires_at: Timestamp


# -- accounts and red packets --------------------------------------------------------------


class Account(TypedDict):
    """A user's balance."""

    user_id: Id
    balance_cents: int


class PacketSent(TypedDict):
    """A sent packet."""

    packet_id: Id
    sender_id: Id
    amount_cents: int
    count: int
    strategy: SplitStrategy
    status: PacketStatus
    expires_at: Timestamp
    message: Annotated[str | None, "the sender's greeting, or null"]
    shares_sha256: Annotated[
        str | None,
        "SHA-256 (hex) over the salt then each share as 8 bytes big-endian, in grab order: "
        "the shares are fixed at send (null for a packet sent before commitments)",
    ]


class Grabbed(TypedDict):
    """The share a user grabbed."""

    status: Literal["grabbed", "already_grabbed"]
    amount_cents: int
    remaining_count: NotRequired[Annotated[int, "shares left after this grab; only with `grabbed`"]]


class PacketGrab(TypedDict):
    """One grab of a packet, in grab order."""

    user_id: Id
    amount_cents: int
    grabbed_at: Timestamp


class PacketSummary(PacketSent):
    """A packet as the listing shows it: the live fields, without its grabs."""

    remaining_count: int
    remaining_cents: int
    refunded_cents: Annotated[int, "what went back to the sender at expiry or withdrawal"]
    recipients_count: Annotated[int, "how many users may grab it (0: anyone)"]
    password_protected: Annotated[bool, "a grab needs the packet's password"]
    version: Annotated[
        int,
        "counts the packet's changes (sent, each grab, sold out, expiry, withdrawal); a "
        "body or event with a larger version is newer",
    ]


class Packet(PacketSummary):
    """A packet with its first grabs."""

    grabs: Annotated[list[PacketGrab], "the first 100 grabs, in grab order"]
    grabs_next_cursor: Annotated[
        str | None, "the cursor of the grabs after these (GET .../grabs), or null"
    ]
    luckiest_user_id: Annotated[
        Id | None, "the largest share once sold out (the earlier grab on a tie), else null"
    ]
    shares: Annotated[
        list[int] | None,
        "the committed shares in grab order, once the packet has ended (null before)",
    ]
    salt: Annotated[str | None, "the commitment's salt (hex), once the packet has ended"]


class GrabsPage(TypedDict):
    """A page of a packet's grabs, in grab order."""

    grabs: list[PacketGrab]
    next_cursor: Annotated[str | None, _NEXT_CURSOR]


class PacketsPage(TypedDict):
    """A page of packets, newest first."""

    packets: list[PacketSummary]
    next_cursor: Annotated[str | None, _NEXT_CURSOR]


class LedgerEntry(TypedDict):
    """One movement of an account's money."""

    kind: EntryKind
    amount_cents: Annotated[int, "signed: a send is negative"]
    balance_after_cents: Annotated[int, "the balance once this entry was applied"]
    reference: Annotated[
        str, "a deposit's reference; for the others the entry's unique business key"
    ]
    packet_id: NotRequired[Annotated[Id | None, "the packet a send, grab or refund belongs to"]]
    at: Timestamp


class LedgerEntriesPage(TypedDict):
    """A page of an account's ledger entries, newest first."""

    entries: list[LedgerEntry]
    next_cursor: Annotated[str | None, _NEXT_CURSOR]


# -- administration ------------------------------------------------------------------------


class AuditEntry(TypedDict):
    """One action an operator took."""

    id: int
    at: Timestamp
    actor: Annotated[
        str,
        "`<role>:<key fingerprint>` (an HMAC of the key under a server-side secret): "
        "never the key's secret",
    ]
    action: Annotated[str, "what was done, e.g. `user.block`"]
    target: Annotated[str, "what it was done to (the route's main id), or empty"]
    reason: Annotated[str | None, "the reason the operator gave, or null"]
    detail: Annotated[dict[str, Any] | None, "what the action answered, or null"]


class AuditPage(TypedDict):
    """A page of the audit log, newest first."""

    entries: list[AuditEntry]
    next_cursor: Annotated[str | None, _NEXT_CURSOR]


class BlockedUser(TypedDict):
    """A user an admin blocked."""

    user_id: Id
    reason: Annotated[str | None, "the admin's reason, or null"]
    blocked_at: Annotated[Timestamp, "when the block began"]


class BlockedUsersPage(TypedDict):
    """A page of the blocked users, in user id order."""

    blocked_users: list[BlockedUser]
    next_cursor: Annotated[str | None, _NEXT_CURSOR]


class Unblocked(TypedDict):
    """Whether a block was lifted."""

    user_id: Id
    unblocked: Annotated[bool, "false when the user was not blocked"]


# -- webhooks ------------------------------------------------------------------------------


class WebhookEndpoint(TypedDict):
    """A webhook endpoint, without its secret (shown only when created or rotated)."""

    endpoint_id: Id
    url: Annotated[str, "where deliveries are POSTed"]
    event_types: Annotated[list[str], 'the event types it gets, or ["*"] for all']
    description: Annotated[str | None, "the admins' note, or null"]
    ordering: Annotated[
        Literal["feed", "entity"],
        "`feed`: attempts in feed order, up to `[webhooks] max_in_flight` at once; "
        "`entity`: one delivery of a team or packet in flight at a time, in version order",
    ]
    disabled: Annotated[bool, "a disabled endpoint gets nothing; its queue waits"]
    disabled_reason: Annotated[
        Literal["gone", "failing", "admin"] | None,
        "`gone`: it answered 410; `failing`: it only failed for "
        "`[webhooks] disable_after_s`; `admin`: disabled by PATCH; null while enabled",
    ]
    created_at: Timestamp
    position: Annotated[int, "the feed id up to which its deliveries are queued"]


class WebhookEndpointCreated(WebhookEndpoint):
    """A registered endpoint; its secret only in the 201 of the registration."""

    secret: NotRequired[
        Annotated[
            str | None,
            "`whsec_<base64>`: the key of its signatures, shown once (absent in a repeat's 200)",
        ]
    ]


class WebhookSecretRotated(WebhookEndpoint):
    """An endpoint with its new secret; the old one signs beside it until it expires."""

    secret: Annotated[str, "the new `whsec_<base64>` secret, shown once"]
    previous_secret_expires_at: Annotated[
        Timestamp, "until then deliveries carry a signature by the old secret too"
    ]


class WebhookEndpointsPage(TypedDict):
    """A page of webhook endpoints, by id."""

    webhooks: list[WebhookEndpoint]
    next_cursor: Annotated[str | None, "pass it as `cursor`; null after the last page"]


class WebhookDeleted(TypedDict):
    """An endpoint removed with its deliveries."""

    endpoint_id: Id
    deleted: Literal[True]


class WebhookAttempt(TypedDict):
    """One POST of a delivery."""

    at: Annotated[Timestamp, "when the attempt ended"]
    status_code: NotRequired[Annotated[int | None, "the HTTP status answered"]]
    error: NotRequired[
        Annotated[
            str | None,
            "instead of a status: timeout, connect_failed, address_refused, "
            "connection_closed, connection_error: ..., payload_too_large: ...",
        ]
    ]
    duration_ms: int
    answer: Annotated[str, "the first 1 KiB of the answer's body"]


class WebhookDelivery(TypedDict):
    """One event owed to an endpoint, with its attempts."""

    webhook_id: Annotated[str, "`evt_<event id>`: the same on every attempt"]
    event_id: int
    event_type: str
    status: Literal["pending", "delivered", "failed"]
    attempts: Annotated[
        list[WebhookAttempt],
        f"its newest attempts (at most {ATTEMPTS_SHOWN}), oldest of them first",
    ]
    attempts_total: Annotated[int, "how many attempts it has"]
    older_attempts_cursor: Annotated[
        str | None,
        "pass it as `cursor` to `GET .../deliveries/{webhook_id}/attempts` for "
        "the attempts before those shown; null when every attempt is shown",
    ]


class WebhookDeliveriesPage(TypedDict):
    """A page of an endpoint's deliveries, newest first."""

    deliveries: list[WebhookDelivery]
    next_cursor: Annotated[str | None, "pass it as `cursor`; null after the last page"]


class WebhookAttemptsPage(TypedDict):
    """A page of one delivery's attempts, newest first."""

    webhook_id: Annotated[str, "`evt_<event id>`: the delivery's"]
    attempts: list[WebhookAttempt]
    next_cursor: Annotated[str | None, "pass it as `cursor`; null after the last page"]


class WebhookReplayQueued(TypedDict):
    """Events queued again for an endpoint."""

    endpoint_id: Id
    after: int
    until: int | None
    queued: Annotated[int, "deliveries queued (events of the types it gets)"]


class WebhookTestAttempt(TypedDict):
    """The attempt of a `webhook.test` message."""

    webhook_id: Annotated[str, "`test_<random>`"]
    succeeded: Annotated[bool, "a 2xx arrived within `[webhooks] timeout_s`"]
    status_code: NotRequired[Annotated[int | None, "the HTTP status answered"]]
    error: NotRequired[Annotated[str | None, "instead of a status: why none came"]]
    duration_ms: int
    answer: Annotated[str, "the first 1 KiB of the answer's body"]
