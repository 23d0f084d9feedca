"""The shapes of the API's success answers: documentation for OpenAPI and docs/api.md.

The services build their answers as plain dicts; these models describe them, and
tests/test_api_reference.py validates real answers against them so the two cannot drift.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from groupbuy.api.endpoints import Id
from groupbuy.webhooks.history import ATTEMPTS_SHOWN

TIMESTAMP_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$"
Timestamp = Annotated[str, Field(pattern=TIMESTAMP_PATTERN)]
"""ISO-8601 UTC with milliseconds, e.g. 2026-11-21T17:42:51.123Z."""


class Answer(BaseModel):
    """Base of answer shapes: every field listed, nothing else in the body."""

    model_config = ConfigDict(extra="forbid")


class Health(Answer):
    """The process is up."""

    status: Literal["ok"]


class Readiness(Answer):
    """Whether Redis and SQL answer and the Lua scripts are loaded."""

    status: Literal["ready", "not ready"]
    checks: dict[str, str] = Field(
        description="redis, scripts, database: `ok` or what is wrong with each"
    )


class Event(Answer):
    """One recorded event."""

    id: int = Field(
        description="increasing, given once the event is committed (an event that commits "
        "later gets a higher id, never one below a cursor already passed); pass the last "
        "one seen as `after`"
    )
    type: str = Field(description="e.g. team.opened, team.formed, lock.expired, packet.refunded")
    at: Timestamp = Field(description="when it took effect")
    data: dict[str, Any] = Field(
        description="the ids and amounts the event concerns, and `version`: its team's or "
        "packet's version after the change (drop an event whose version is not newer than "
        "the one you hold); `team.formed` also has `virtual_seats` (seats counted as filled "
        "by virtual completion, 0 for a team that filled up)"
    )


class EventsPage(Answer):
    """A page of the events feed."""

    events: list[Event]
    next_after: int = Field(description="the `after` of the next page")


class ReconcileReport(Answer):
    """A reconciliation run: what it checked and every mismatch found twice."""

    id: int
    started_at: Timestamp
    finished_at: Timestamp
    since: Timestamp | None = Field(description="start of the previous run; null on the first")
    packets_checked: int
    teams_checked: int
    accounts_checked: int
    pending_records: int = Field(description="records still in outbox streams (not compared)")
    mismatch_count: int
    mismatches: list[dict[str, Any]] = Field(description="the first 1000, each with its `kind`")


class _JobRun(Answer):
    """What every job report starts with."""

    duration_ms: float = Field(description="how long the run took")


class TeamSweepReport(_JobRun):
    """A run of sweep_locks (expired seat locks) or expire_teams (passed deadlines)."""

    job: Literal["sweep_locks", "expire_teams"]
    activities: int = Field(description="activities whose due index was read")
    teams: int = Field(description="teams the run looked at")
    locks_expired: int
    teams_failed: int = Field(description="teams this run ended as failed")
    teams_formed_virtually: int = Field(description="teams this run formed by virtual completion")


class ExpirePacketsReport(_JobRun):
    """A run of expire_packets."""

    job: Literal["expire_packets"]
    due: int = Field(description="packets whose time was over")
    expired: int = Field(description="packets this run expired (and refunded)")


class FlushRecordsReport(_JobRun):
    """A run of flush_records, the write-behind from Redis to SQL."""

    job: Literal["flush_records"]
    team_records: int = Field(description="team records written to SQL")
    packet_records: int = Field(description="packet records written to SQL")
    complete: bool = Field(
        description="false when a scheduled run's time ran out and left records for the next "
        "run (a run by hand writes everything waiting)"
    )
    backlog: int = Field(description="records still waiting in Redis afterwards")
    lag_s: float = Field(description="age of the oldest waiting record, in seconds")


class RepairReport(_JobRun):
    """A run of repair."""

    job: Literal["repair"]
    pending: int = Field(description="sends whose Redis step had not happened")
    made_live: int = Field(description="of those, packets created in Redis now")
    refunded: int = Field(description="of those, packets already over: refunded")
    teams_released: int = Field(description="ended teams removed from Redis (recorded in SQL)")
    activities_released: int = Field(description="activities with no live team left in Redis")
    activities_reindexed: int
    teams_restored: int = Field(description="live teams rebuilt in Redis from SQL")
    packets_released: int = Field(description="ended packets removed from Redis")
    packets_reindexed: int
    packets_restored: int = Field(description="live packets rebuilt in Redis from SQL")
    blocked_users: int = Field(description="users on the admin blocklist (SQL's count)")
    blocklist_rebuilt: int = Field(
        description="Redis's copies of the blocklist that differed from SQL and were rebuilt "
        "(one on one Redis server; in Redis Cluster also one per slot in use)"
    )


class DeadLetter(Answer):
    """An outbox record SQL could not apply, kept instead of dropped."""

    id: int = Field(description="the dead letter's id (pages follow it)")
    stream: Literal["packets", "teams"] = Field(
        description="which write-behind held it: a packet's grabs and endings, or an "
        "activity's team records"
    )
    owner_id: str = Field(description="the packet id or activity id whose outbox held it")
    entry_id: str = Field(description="its id in that Redis stream")
    fields: dict[str, str] = Field(description="the record as the script wrote it")
    error: str = Field(description="why SQL could not apply it")
    dead_at: Timestamp = Field(description="when it was moved to the dead letters")
    replayed_at: Timestamp | None = Field(
        description="when an operator replayed it into SQL (POST .../replay); null until then"
    )


class DeadLettersPage(Answer):
    """A page of dead letters, oldest first."""

    dead_letters: list[DeadLetter]
    next_cursor: str | None = Field(
        description="pass it as `cursor` for the next page; null after the last page"
    )


class VirtualCompletionRule(Answer):
    """An activity's virtual completion (模拟成团)."""

    min_members: int


class ActivityLimitsRule(Answer):
    """An activity's per-user limits (null: no limit of that kind)."""

    teams_per_user: int | None
    open_teams_per_leader: int | None


class Activity(Answer):
    """An activity, the parameters its teams take, and its live counts."""

    activity_id: Id
    name: str | None
    team_size: int
    lock_ttl_s: int
    team_deadline_s: int
    virtual_completion: VirtualCompletionRule | None = Field(
        description="at the deadline a team with at least min_members real members is formed "
        "(its missing seats counted as virtual_seats) instead of failed"
    )
    limits: ActivityLimitsRule | None = Field(
        description="per-user limits; past one, opening, locking or confirming answers 409 "
        "user_limit_reached"
    )
    created_at: Timestamp
    status: Literal["open", "closed"] = Field(
        description="`closed`: an admin ended the sale early; no team opens, no seat is "
        "locked or joined (409 activity_closed), teams already open run to their deadline"
    )
    teams_open: int = Field(ge=0, description="teams open now (a team past its deadline is not)")
    teams_formed: int = Field(ge=0, description="teams formed, virtual completions included")
    teams_failed: int = Field(ge=0, description="teams that failed at their deadline")
    members: int = Field(ge=0, description="members of open and formed teams, leaders included")
    live_locks: int = Field(ge=0, description="seat locks not expired now")
    virtual_completions: int = Field(
        ge=0, description="teams formed by virtual completion at their deadline"
    )


class ActivitiesPage(Answer):
    """A page of activities, newest first."""

    activities: list[Activity]
    next_cursor: str | None = Field(
        description="pass it as `cursor` for the next page; null after the last page"
    )


class Member(Answer):
    """A member of a team, in joining order."""

    user_id: Id
    order_id: Id | None
    joined_at: Timestamp


class SeatLock(Answer):
    """An unexpired seat lock, oldest first."""

    user_id: Id
    locked_at: Timestamp
    expires_at: Timestamp


class Team(Answer):
    """A team; while open, len(members) + len(locks) + free_seats == size."""

    activity_id: Id
    team_id: Id
    leader_id: Id
    status: Literal["open", "formed", "failed"]
    size: int
    members: list[Member]
    locks: list[SeatLock] = Field(description="never an expired lock; empty once ended")
    free_seats: int = Field(description="0 once the team is formed or failed")
    next_unlock_at: Timestamp | None = Field(description="when the earliest lock expires")
    deadline_at: Timestamp = Field(description="an open team fails at this time")
    formed_at: Timestamp | None
    failed_at: Timestamp | None
    virtual_seats: int = Field(
        description="seats counted as filled when the team was formed by virtual completion"
    )
    version: int = Field(
        description="counts the team's changes (open, each lock, unlock, lock expiry, member, "
        "formed, failed); a body or event with a larger version is newer"
    )


class LockTaken(Answer):
    """A seat lock held for a user."""

    status: Literal["locked"]
    user_id: Id
    team_id: Id
    locked_at: Timestamp
    expires_at: Timestamp
    released_team_id: Id | None = Field(
        description="the team of this activity whose lock was released to allow this one "
        "(null when joining any team: a live lock is the answer there)"
    )
    version: int = Field(description="the team's version after this lock")
    existing: Literal[True] | None = Field(
        default=None, description="present (true) only when the lock already existed"
    )


class TeamsPage(Answer):
    """A page of an activity's teams: open ones closest to forming first, formed or failed
    ones newest end first."""

    teams: list[Team]
    next_cursor: str | None = Field(
        description="pass it as `cursor` for the next page; null after the last page"
    )


class Released(Answer):
    """Whether a lock was released."""

    released: bool = Field(description="false when the user held no lock on the team")


class Confirmed(Answer):
    """A confirmed member's team."""

    team: Team
    formed: bool = Field(description="the team is formed (this confirm or an earlier one)")


class UserLock(Answer):
    """A user's current lock in an activity."""

    team_id: Id
    locked_at: Timestamp
    expires_at: Timestamp


class Account(Answer):
    """A user's balance."""

    user_id: Id
    balance_cents: int


class PacketSent(Answer):
    """A sent packet."""

    packet_id: Id
    sender_id: Id
    amount_cents: int
    count: int
    strategy: Literal["double_mean", "equal"]
    status: Literal["active", "sold_out", "expired"]
    expires_at: Timestamp


class Grabbed(Answer):
    """The share a user grabbed."""

    status: Literal["grabbed", "already_grabbed"]
    amount_cents: int
    remaining_count: int | None = Field(
        default=None, description="shares left after this grab; only with `grabbed`"
    )


class PacketGrab(Answer):
    """One grab of a packet, in grab order."""

    user_id: Id
    amount_cents: int
    grabbed_at: Timestamp


class PacketSummary(PacketSent):
    """A packet as the listing shows it: the live fields, without its grabs."""

    remaining_count: int
    remaining_cents: int
    refunded_cents: int = Field(description="what went back to the sender at expiry")
    version: int = Field(
        description="counts the packet's changes (sent, each grab, sold out, expiry); a "
        "body or event with a larger version is newer"
    )


class Packet(PacketSummary):
    """A packet with its grabs."""

    grabs: list[PacketGrab]
    luckiest_user_id: Id | None = Field(
        description="the largest share once sold out (the earlier grab on a tie), else null"
    )


class PacketsPage(Answer):
    """A page of packets, newest first."""

    packets: list[PacketSummary]
    next_cursor: str | None = Field(
        description="pass it as `cursor` for the next page; null after the last page"
    )


class LedgerEntry(Answer):
    """One movement of an account's money."""

    kind: Literal["deposit", "send", "grab", "refund"]
    amount_cents: int = Field(description="signed: a send is negative")
    balance_after_cents: int = Field(description="the balance once this entry was applied")
    reference: str = Field(
        description="a deposit's reference; for the others the entry's unique business key"
    )
    packet_id: Id | None = Field(
        default=None, description="the packet a send, grab or refund belongs to"
    )
    at: Timestamp


class LedgerEntriesPage(Answer):
    """A page of an account's ledger entries, newest first."""

    entries: list[LedgerEntry]
    next_cursor: str | None = Field(
        description="pass it as `cursor` for the next page; null after the last page"
    )


class AuditEntry(Answer):
    """One action an operator took."""

    id: int
    at: Timestamp
    actor: str = Field(
        description="`<role>:<key fingerprint>` (an HMAC of the key under a server-side secret): "
        "never the key's secret"
    )
    action: str = Field(description="what was done, e.g. `user.block`")
    target: str = Field(description="what it was done to (the route's main id), or empty")
    reason: str | None = Field(description="the reason the operator gave, or null")
    detail: dict[str, Any] | None = Field(description="what the action answered, or null")


class AuditPage(Answer):
    """A page of the audit log, newest first."""

    entries: list[AuditEntry]
    next_cursor: str | None = Field(
        description="pass it as `cursor` for the next page; null after the last page"
    )


class BlockedUser(Answer):
    """A user an admin blocked."""

    user_id: Id
    reason: str | None = Field(description="the admin's reason, or null")
    blocked_at: Timestamp = Field(description="when the block began")


class BlockedUsersPage(Answer):
    """A page of the blocked users, in user id order."""

    blocked_users: list[BlockedUser]
    next_cursor: str | None = Field(
        description="pass it as `cursor` for the next page; null after the last page"
    )


class Unblocked(Answer):
    """Whether a block was lifted."""

    user_id: Id
    unblocked: bool = Field(description="false when the user was not blocked")


class ReconcileRunReport(ReconcileReport):
    """A run of reconcile: its stored report (as GET /v1/admin/reconcile answers it)."""

    job: Literal["reconcile"]
    duration_ms: float = Field(description="how long the run took")


class JobReport(
    RootModel[
        Annotated[
            TeamSweepReport
            | ExpirePacketsReport
            | FlushRecordsReport
            | RepairReport
            | ReconcileRunReport,
            Field(discriminator="job"),
        ]
    ]
):
    """What a job run did: the report of the job named by `job`."""


class OpenApiDocument(Answer):
    """An OpenAPI 3.1 document (https://spec.openapis.org/oas/v3.1.0)."""

    model_config = ConfigDict(extra="allow")

    openapi: str = Field(pattern=r"^3\.1\.\d+$")
    info: dict[str, Any]
    paths: dict[str, dict[str, Any]]
    components: dict[str, Any]


class WebhookEndpoint(Answer):
    """A webhook endpoint, without its secret (shown only when created or rotated)."""

    endpoint_id: Id
    url: str = Field(description="where deliveries are POSTed")
    event_types: list[str] = Field(description='the event types it gets, or ["*"] for all')
    description: str | None = Field(description="the admins' note, or null")
    ordering: Literal["feed", "entity"] = Field(
        description="`feed`: attempts in feed order, up to `[webhooks] max_in_flight` at once; "
        "`entity`: one delivery of a team or packet in flight at a time, in version order"
    )
    disabled: bool = Field(description="a disabled endpoint gets nothing; its queue waits")
    disabled_reason: Literal["gone", "failing", "admin"] | None = Field(
        description="`gone`: it answered 410; `failing`: it only failed for "
        "`[webhooks] disable_after_s`; `admin`: disabled by PATCH; null while enabled"
    )
    created_at: Timestamp
    position: int = Field(description="the feed id up to which its deliveries are queued")


class WebhookEndpointCreated(WebhookEndpoint):
    """A registered endpoint; its secret only in the 201 of the registration."""

    secret: str | None = Field(
        default=None,
        description="`whsec_<base64>`: the key of its signatures, shown once (absent in a "
        "repeat's 200)",
    )


class WebhookSecretRotated(WebhookEndpoint):
    """An endpoint with its new secret; the old one signs beside it until it expires."""

    secret: str = Field(description="the new `whsec_<base64>` secret, shown once")
    previous_secret_expires_at: Timestamp = Field(
        description="until then deliveries carry a signature by the old secret too"
    )


class WebhookEndpointsPage(Answer):
    """A page of webhook endpoints, by id."""

    webhooks: list[WebhookEndpoint]
    next_cursor: str | None = Field(description="pass it as `cursor`; null after the last page")


class WebhookDeleted(Answer):
    """An endpoint removed with its deliveries."""

    endpoint_id: Id
    deleted: Literal[True]


class WebhookAttempt(Answer):
    """One POST of a delivery."""

    at: Timestamp = Field(description="when the attempt ended")
    status_code: int | None = Field(default=None, description="the HTTP status answered")
    error: str | None = Field(
        default=None,
        description="instead of a status: timeout, connect_failed, address_refused, "
        "connection_closed, connection_error: ..., payload_too_large: ...",
    )
    duration_ms: int
    answer: str = Field(description="the first 1 KiB of the answer's body")


class WebhookDelivery(Answer):
    """One event owed to an endpoint, with its attempts."""

    webhook_id: str = Field(description="`evt_<event id>`: the same on every attempt")
    event_id: int
    event_type: str
    status: Literal["pending", "delivered", "failed"]
    attempts: list[WebhookAttempt] = Field(
        description=f"its newest attempts (at most {ATTEMPTS_SHOWN}), oldest of them first"
    )
    attempts_total: int = Field(description="how many attempts it has")
    older_attempts_cursor: str | None = Field(
        description="pass it as `cursor` to `GET .../deliveries/{webhook_id}/attempts` for "
        "the attempts before those shown; null when every attempt is shown"
    )


class WebhookDeliveriesPage(Answer):
    """A page of an endpoint's deliveries, newest first."""

    deliveries: list[WebhookDelivery]
    next_cursor: str | None = Field(description="pass it as `cursor`; null after the last page")


class WebhookAttemptsPage(Answer):
    """A page of one delivery's attempts, newest first."""

    webhook_id: str = Field(description="`evt_<event id>`: the delivery's")
    attempts: list[WebhookAttempt]
    next_cursor: str | None = Field(description="pass it as `cursor`; null after the last page")


class WebhookReplayQueued(Answer):
    """Events queued again for an endpoint."""

    endpoint_id: Id
    after: int
    until: int | None
    queued: int = Field(description="deliveries queued (events of the types it gets)")


class WebhookTestAttempt(Answer):
    """The attempt of a `webhook.test` message."""

    webhook_id: str = Field(description="`test_<random>`")
    succeeded: bool = Field(description="a 2xx arrived within `[webhooks] timeout_s`")
    status_code: int | None = Field(default=None, description="the HTTP status answered")
    error: str | None = Field(default=None, description="instead of a status: why none came")
    duration_ms: int
    answer: str = Field(description="the first 1 KiB of the answer's body")
