"""HTTP endpoints of activities, teams and seat locks (parse, call the team engine, answer)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from groupbuy_client import wire
from groupbuy_client.wire import SaleStatus, from_ms, to_ms
from pydantic import AfterValidator, AwareDatetime, Field, field_validator, model_validator
from starlette.requests import Request
from starlette.responses import Response

from groupbuy import errors
from groupbuy.api.audit import ActionReason
from groupbuy.api.endpoints import (
    TEXT_PATTERN,
    Endpoint,
    Id,
    LaxQuery,
    Problems,
    StrictBody,
    created_response,
    json_response,
)
from groupbuy.locks.codec import parse_page_cursor
from groupbuy.locks.engine import TeamEngine
from groupbuy.locks.sale import MAX_HOLD_S, MAX_STOCK, Sale
from groupbuy.locks.waitlist_rules import WaitlistRules
from groupbuy.settings import LockTtlS, TeamDeadlineS, TeamSize, UserLimit


def _on_the_ms(moment: datetime) -> datetime:
    """A sale's time: aware, within Redis's and SQL's range, kept to the millisecond."""
    if not 0 <= to_ms(moment) <= _MAX_CURSOR_MS:
        raise ValueError("a time from 1970 to 9999")
    return from_ms(to_ms(moment))


SaleTime = Annotated[AwareDatetime, AfterValidator(_on_the_ms)]
Stock = Annotated[int, Field(ge=1, le=MAX_STOCK)]
MaxHoldS = Annotated[int, Field(ge=1, le=MAX_HOLD_S)]


class VirtualCompletion(StrictBody):
    """At the deadline a team with at least `min_members` real members is formed."""

    min_members: TeamSize = Field(description="2 <= min_members <= the activity's team_size")


class ActivityLimits(StrictBody):
    """Per-user limits of an activity; an omitted one does not apply."""

    teams_per_user: UserLimit | None = Field(
        default=None, description="teams of the activity a user may belong to (open or formed)"
    )
    open_teams_per_leader: UserLimit | None = Field(
        default=None, description="open teams one leader may lead at once"
    )


class WaitlistCreate(StrictBody):
    """An activity's waitlist; an omitted number takes its default."""

    max_len: int | None = Field(
        default=None, ge=1, le=100_000, description="entries in the lines at most (10000)"
    )
    ttl_s: LockTtlS | None = Field(
        default=None, description="an entry leaves the line this long after it queued (600)"
    )
    offer_ttl_s: LockTtlS | None = Field(
        default=None, description="the lifetime of a lock the line offers (lock_ttl_s)"
    )


class ActivityCreate(StrictBody):
    """Body of POST /v1/activities (omitted numbers take the configured defaults)."""

    activity_id: Id
    name: str | None = Field(
        default=None, max_length=200, pattern=TEXT_PATTERN, description="any text but U+0000"
    )
    team_size: TeamSize | None = None
    lock_ttl_s: LockTtlS | None = None
    team_deadline_s: TeamDeadlineS | None = None
    virtual_completion: VirtualCompletion | None = None
    limits: ActivityLimits | None = None
    starts_at: SaleTime | None = Field(
        default=None, description="when the sale opens (ISO-8601 with its offset, e.g. Z)"
    )
    ends_at: SaleTime | None = Field(
        default=None, description="when the sale ends; after `starts_at`"
    )
    stock: Stock | None = Field(default=None, description="the units the activity may sell")
    max_hold_s: MaxHoldS | None = Field(
        default=None,
        description="the longest a seat lock may be held (lock_ttl_s..86400; default lock_ttl_s)",
    )
    late_confirm: bool = Field(
        default=False,
        description="a confirm whose lock expired still joins while a seat and a unit are free",
    )
    waitlist: WaitlistCreate | None = None

    @model_validator(mode="after")
    def _ends_after_it_starts(self) -> ActivityCreate:
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            raise ValueError("ends_at must be after starts_at")
        return self


class TeamOpen(StrictBody):
    """Body of POST .../teams."""

    leader_id: Id
    team_id: Id | None = None
    order_id: Id | None = None


class LockRequest(StrictBody):
    """Body of POST .../locks."""

    user_id: Id


class LockExtend(StrictBody):
    """Body of PATCH .../locks/{user_id}: the payment is taking longer."""

    hold_s: int = Field(
        ge=1,
        le=86400,
        description="the lock expires this long after it was taken (never after the team's "
        "deadline); the activity's lock_ttl_s <= hold_s <= its max_hold_s",
    )


class MemberConfirm(StrictBody):
    """Body of POST .../members: the payment of `order_id` succeeded."""

    user_id: Id
    order_id: Id


class MemberLeave(StrictBody):
    """Body of POST .../members/{user_id}/leave: the shop refunded the member."""

    order_id: Id | None = Field(
        default=None,
        description="the member's order: required when the member joined with one (a leader "
        "who opened without an order leaves without one)",
    )
    reason: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=TEXT_PATTERN,
        description="why: `refund`, `cancel` or any text (carried by the event)",
    )


class TeamDissolve(ActionReason):
    """Body of POST /v1/admin/activities/{activity_id}/teams/{team_id}/dissolve: why (kept
    in the audit log)."""


# The times a cursor of a newest-first SQL page may carry (ms since the epoch, before 10000).
_MAX_CURSOR_MS = 253_402_300_799_999


def _sql_page_cursor(value: str) -> None:
    """ValueError (422) unless `value` is a cursor a newest-first SQL page answered."""
    if not 0 <= parse_page_cursor(value).score <= _MAX_CURSOR_MS:
        raise ValueError("not a cursor this list answered")


class TeamsQuery(LaxQuery):
    """Query of GET .../teams: a page of open teams (with a free seat, or full), or of the
    formed or failed ones."""

    status: Literal["open", "formed", "failed"] = Field(
        default="open",
        description="`open`: live from Redis, closest to forming first (with "
        "`has_free_seats`); `formed` / `failed`: from SQL, newest end first",
    )
    has_free_seats: bool | None = Field(
        default=None,
        description="with `status=open` only: `true` (the default) the teams with a free "
        "seat; `false` the open teams full of members and locks, earliest deadline first",
    )
    limit: int = Field(default=20, ge=1, le=100, description="teams per page")
    cursor: str | None = Field(
        default=None,
        max_length=200,
        description="the `next_cursor` of the previous page of the same list; absent for the "
        "first page",
    )

    @field_validator("cursor")
    @classmethod
    def _cursor_of_this_list(cls, value: str | None) -> str | None:
        if value is not None:
            parse_page_cursor(value)  # ValueError: 422
        return value

    @model_validator(mode="after")
    def _free_seats_of_open_teams(self) -> TeamsQuery:
        if self.status != "open":
            if self.has_free_seats is not None:
                raise ValueError("has_free_seats applies to status=open only")
            if self.cursor is not None:
                _sql_page_cursor(self.cursor)
        return self


class ActivityUpdate(StrictBody):
    """Body of PATCH /v1/activities/{activity_id}: a new name, and/or closing it (final)."""

    name: str | None = Field(
        default=None, max_length=200, pattern=TEXT_PATTERN, description="any text but U+0000"
    )
    status: Literal["closed"] | None = Field(
        default=None,
        description="only `closed`: ends the sale early (a closed activity stays closed)",
    )
    ends_at: SaleTime | None = Field(
        default=None, description="a new end of the sale; after its `starts_at`"
    )
    stock: Stock | None = Field(
        default=None,
        description="a new stock: raised, or lowered down to the units held (members of open "
        "and formed teams + live locks), never below",
    )


class ActivitiesQuery(LaxQuery):
    """Query of GET /v1/activities: a page of activities, newest first."""

    status: SaleStatus | None = Field(
        default=None,
        description="only activities of this status (judged on Redis's clock); absent: all",
    )
    limit: int = Field(default=20, ge=1, le=100, description="activities per page")
    cursor: str | None = Field(
        default=None,
        max_length=200,
        description="the `next_cursor` of the previous page; absent for the first page",
    )

    @field_validator("cursor")
    @classmethod
    def _cursor_of_this_list(cls, value: str | None) -> str | None:
        if value is not None:
            _sql_page_cursor(value)  # ValueError: 422
        return value


def _teams(request: Request) -> TeamEngine:
    teams: TeamEngine = request.app.state.services.teams
    return teams


async def create_activity(request: Request, body: ActivityCreate) -> Response:
    virtual, limits = body.virtual_completion, body.limits or ActivityLimits()
    sale_fields = {"starts_at", "ends_at", "stock", "max_hold_s", "late_confirm"}
    fields = body.model_dump(exclude={"virtual_completion", "limits", "waitlist", *sale_fields})
    waitlist = WaitlistRules(**body.waitlist.model_dump()) if body.waitlist else None
    outcome = await _teams(request).activities.create_activity(
        **fields,
        virtual_min_members=virtual.min_members if virtual else None,
        **limits.model_dump(),
        sale=Sale(**body.model_dump(include=sale_fields), waitlist=waitlist),
    )
    return created_response(outcome)


async def get_activity(request: Request) -> Response:
    return json_response(
        await _teams(request).activities.get_activity(request.path_params["activity_id"])
    )


async def list_activities(request: Request, query: ActivitiesQuery) -> Response:
    page = await _teams(request).listings.activities(query.status, query.limit, query.cursor)
    return json_response(page)


async def update_activity(request: Request, body: ActivityUpdate) -> Response:
    activity_id = request.path_params["activity_id"]
    outcome = await _teams(request).activities.update_activity(
        activity_id,
        name=body.name,
        close=body.status == "closed",
        ends_at=body.ends_at,
        stock=body.stock,
    )
    return json_response(outcome.body)  # the route writes the audit row (Endpoint.audit)


async def open_team(request: Request, body: TeamOpen) -> Response:
    outcome = await _teams(request).activities.open_team(
        request.path_params["activity_id"], **body.model_dump()
    )
    return created_response(outcome)


async def get_team(request: Request) -> Response:
    p = request.path_params
    return json_response(await _teams(request).activities.get_team(p["activity_id"], p["team_id"]))


async def lock_seat(request: Request, body: LockRequest) -> Response:
    p = request.path_params
    return created_response(
        await _teams(request).seats.lock(p["activity_id"], p["team_id"], body.user_id)
    )


async def join_team(request: Request, body: LockRequest) -> Response:
    return created_response(
        await _teams(request).seats.join(request.path_params["activity_id"], body.user_id)
    )


async def list_teams(request: Request, query: TeamsQuery) -> Response:
    activity_id = request.path_params["activity_id"]
    teams = _teams(request)
    if query.status != "open":
        page = await teams.listings.ended_teams(
            activity_id, query.status, query.limit, query.cursor
        )
    else:
        page = await teams.activities.list_open_teams(
            activity_id, query.limit, query.cursor, full=query.has_free_seats is False
        )
    return json_response(page)


async def unlock_seat(request: Request) -> Response:
    p = request.path_params
    released = await _teams(request).seats.unlock(p["activity_id"], p["team_id"], p["user_id"])
    return json_response({"released": released})


async def extend_lock(request: Request, body: LockExtend) -> Response:
    p = request.path_params
    extended = await _teams(request).seats.extend(
        p["activity_id"], p["team_id"], p["user_id"], body.hold_s
    )
    return json_response(extended)


async def confirm_member(request: Request, body: MemberConfirm) -> Response:
    p = request.path_params
    outcome = await _teams(request).seats.confirm(
        p["activity_id"], p["team_id"], body.user_id, body.order_id
    )
    return created_response(outcome)


async def leave_team(request: Request, body: MemberLeave) -> Response:
    p = request.path_params
    left = await _teams(request).seats.leave(
        p["activity_id"], p["team_id"], p["user_id"], body.order_id, body.reason
    )
    return json_response(left)


async def dissolve_team(request: Request, body: TeamDissolve) -> Response:
    p = request.path_params
    dissolved = await _teams(request).dissolve(p["activity_id"], p["team_id"])
    return json_response(dissolved)  # the route writes the audit row (Endpoint.audit)


async def get_user_lock(request: Request) -> Response:
    p = request.path_params
    return json_response(await _teams(request).seats.current_lock(p["activity_id"], p["user_id"]))


_TEAM = "/v1/activities/{activity_id}/teams/{team_id}"
NO_ACTIVITY_PROBLEMS: Problems = {errors.ActivityNotFound: "no activity has this id"}
NO_TEAM_PROBLEMS: Problems = {
    errors.TeamNotFound: "the activity has no team with this id",
    **NO_ACTIVITY_PROBLEMS,
}
OVER_LIMIT_PROBLEMS: Problems = {
    errors.UserLimitReached: "the user is at one of the activity's limits: `limit`, `current` "
    "and `limit_name` (teams_per_user or open_teams_per_leader)"
}
BLOCKED_PROBLEMS: Problems = {errors.UserBlocked: "an admin blocked the user (`user_id`)"}
CLOSED_PROBLEMS: Problems = {
    errors.ActivityClosed: "an admin closed the activity: the sale is over (answered before "
    "any other refusal)"
}
SALE_PROBLEMS: Problems = {
    errors.ActivityNotStarted: "before the sale's `starts_at` (carried), right after "
    "`activity_closed`",
    errors.ActivityEnded: "the sale's `ends_at` has passed",
    errors.ActivitySoldOut: "every unit of the activity's stock is held by a member or a live "
    "lock; `next_unlock_at`: when the earliest live lock of the activity expires, or null",
}
ENDED_PROBLEMS: Problems = {
    errors.TeamFormed: "the team is formed: it takes no more seats",
    errors.TeamFailed: "the team failed: its deadline passed (found now or earlier)",
}

ENDPOINTS = [
    Endpoint(
        "POST",
        "/v1/activities",
        create_activity,
        "Create an activity",
        role="admin",
        body=ActivityCreate,
        tag="activities",
        responses={
            201: "Created",
            200: "The same id and parameters again: the original, unchanged",
        },
        answer=wire.Activity,
        problems={
            errors.Conflict: "the id exists with other parameters; `activity` is the existing one"
        },
        audit="activity.create",
    ),
    Endpoint(
        "GET",
        "/v1/activities/{activity_id}",
        get_activity,
        "Read an activity",
        rate_class="read",
        tag="activities",
        responses={200: "The activity"},
        answer=wire.Activity,
        problems=NO_ACTIVITY_PROBLEMS,
    ),
    Endpoint(
        "PATCH",
        "/v1/activities/{activity_id}",
        update_activity,
        "Rename or close an activity",
        role="admin",
        body=ActivityUpdate,
        tag="activities",
        responses={
            200: "The activity after the change; closing again changes nothing (idempotent)"
        },
        answer=wire.Activity,
        problems={
            errors.Conflict: "`stock` is below the units held now (`stock_held`): nothing changed",
            **NO_ACTIVITY_PROBLEMS,
        },
        audit="activity.update",
    ),
    Endpoint(
        "GET",
        "/v1/activities",
        list_activities,
        "List activities, newest first",
        rate_class="read",
        query=ActivitiesQuery,
        tag="activities",
        responses={200: "A page of activities, newest first (by created_at, then id)"},
        answer=wire.ActivitiesPage,
    ),
    Endpoint(
        "POST",
        "/v1/activities/{activity_id}/teams",
        open_team,
        "Open a team (leader is member 1)",
        rate_class="seat",
        rate_user="leader_id",
        body=TeamOpen,
        tag="teams",
        responses={
            201: "Opened; the server names the team when `team_id` is absent",
            200: "The same team id, leader and order again: the team as it is now",
        },
        answer=wire.Team,
        problems={
            **CLOSED_PROBLEMS,
            **SALE_PROBLEMS,
            errors.Conflict: "the team id exists with another leader or order",
            **OVER_LIMIT_PROBLEMS,
            **BLOCKED_PROBLEMS,
            **NO_ACTIVITY_PROBLEMS,
        },
    ),
    Endpoint(
        "GET",
        "/v1/activities/{activity_id}/teams",
        list_teams,
        "List an activity's teams: open (with a free seat, or full), formed or failed",
        rate_class="read",
        query=TeamsQuery,
        tag="teams",
        responses={
            200: "A page of teams. Open with a free seat: closest to forming first (most "
            "members + live locks, then the oldest), as `POST .../locks` would pick them. "
            "Open and full: earliest deadline first. Formed or failed: from SQL, newest end "
            "first (a team is listed within seconds of its end). An open page may hold fewer "
            "than `limit` teams while `next_cursor` is not null"
        },
        answer=wire.TeamsPage,
        problems=NO_ACTIVITY_PROBLEMS,
    ),
    Endpoint(
        "POST",
        "/v1/activities/{activity_id}/locks",
        join_team,
        "Join any team: lock a free seat in the open team closest to forming",
        rate_class="seat",
        rate_user="user_id",
        body=LockRequest,
        tag="teams",
        responses={
            201: "A new lock in the open team with the most members + live locks (then the "
            "oldest) that the user is not a member of; `team_id` names it",
            200: "The user's unexpired lock in the activity, wherever it is, unchanged "
            "(`existing`: true)",
        },
        answer=wire.LockTaken,
        problems={
            **CLOSED_PROBLEMS,
            **SALE_PROBLEMS,
            errors.NoTeamAvailable: "no open team has a free seat for the user at this instant "
            "(a seat whose lock has expired counts as free); `next_unlock_at`: when the "
            "activity's earliest lock expires, or null. Open a new team instead",
            **OVER_LIMIT_PROBLEMS,
            **BLOCKED_PROBLEMS,
            **NO_ACTIVITY_PROBLEMS,
        },
    ),
    Endpoint(
        "GET",
        _TEAM,
        get_team,
        "Read a team",
        rate_class="read",
        tag="teams",
        responses={200: "The team: live from Redis, or from SQL once ended and released"},
        answer=wire.Team,
        problems=NO_TEAM_PROBLEMS,
    ),
    Endpoint(
        "POST",
        f"{_TEAM}/locks",
        lock_seat,
        "Lock a free seat for a user",
        rate_class="seat",
        rate_user="user_id",
        body=LockRequest,
        tag="teams",
        responses={
            201: "A new lock; `released_team_id` names the lock it replaced in this activity",
            200: "The user's unexpired lock on this team, unchanged (`existing`: true)",
        },
        answer=wire.LockTaken,
        problems={
            **CLOSED_PROBLEMS,
            **SALE_PROBLEMS,
            errors.TeamFull: "every seat is a member or an unexpired lock; `next_unlock_at` "
            "(when the earliest lock expires, null if all seats are members) and "
            "`earliest_locked_at`",
            errors.AlreadyMember: "the user is a member of this team",
            errors.LeftTeam: "the user left this team (POST .../leave): no seat in it again",
            **OVER_LIMIT_PROBLEMS,
            **BLOCKED_PROBLEMS,
            **ENDED_PROBLEMS,
            errors.Conflict: "the user's lock in another team kept changing during the "
            "switch; retry",
            **NO_TEAM_PROBLEMS,
        },
    ),
    Endpoint(
        "DELETE",
        f"{_TEAM}/locks/{{user_id}}",
        unlock_seat,
        "Release a user's seat lock",
        rate_class="seat",
        rate_user="user_id",
        tag="teams",
        responses={200: "Done, released or not (idempotent)"},
        answer=wire.Released,
        problems=NO_TEAM_PROBLEMS,
    ),
    Endpoint(
        "PATCH",
        f"{_TEAM}/locks/{{user_id}}",
        extend_lock,
        "Extend a user's seat lock: the payment is taking longer",
        rate_class="seat",
        rate_user="user_id",
        body=LockExtend,
        tag="teams",
        responses={
            200: "The lock, expiring `hold_s` after `locked_at` (at the team's deadline at "
            "the latest), with the team's `version`; a hold that would shorten it, or a "
            "repeat, leaves it as it was (the same body)"
        },
        answer=wire.LockTaken,
        problems={
            errors.InvalidRequest: "a path id or the body is malformed, unknown, missing or "
            "out of range (`errors` lists each `field` and `message`), or `hold_s` is below "
            "the activity's `lock_ttl_s` or above its `max_hold_s` (the answer's `min_hold_s` "
            "and `max_hold_s`); nothing changed",
            errors.LockRequired: "the user holds no unexpired lock on this team",
            **NO_TEAM_PROBLEMS,
        },
    ),
    Endpoint(
        "POST",
        f"{_TEAM}/members",
        confirm_member,
        "Payment succeeded: lock becomes membership",
        rate_class="seat",
        rate_user="user_id",
        body=MemberConfirm,
        tag="teams",
        responses={
            201: "Joined; `formed` is true only for the confirm that completed the team",
            200: "The same user and order again: the team as it is now, and the same "
            "`formed` as the first answer",
        },
        answer=wire.Confirmed,
        problems={
            errors.LockRequired: "the user holds no unexpired lock on this team (refund them)",
            errors.AlreadyMember: "the user joined this team with another order",
            errors.LeftTeam: "the user left this team: no seat in it again (refund them)",
            errors.DatabaseUnavailable: "the membership is not recorded in SQL yet (the "
            "database is down, locked or slow): the seat stays the user's; retry the same "
            "confirm, which answers 200 once the record is in SQL (do not refund)",
            **OVER_LIMIT_PROBLEMS,
            **BLOCKED_PROBLEMS,
            **ENDED_PROBLEMS,
            **NO_TEAM_PROBLEMS,
        },
    ),
    Endpoint(
        "POST",
        f"{_TEAM}/members/{{user_id}}/leave",
        leave_team,
        "The shop refunded a member: out of an open team, or refunded in a formed one",
        rate_class="seat",
        rate_user="user_id",
        body=MemberLeave,
        tag="teams",
        responses={
            200: "Open team: the member left (`left`: true), the seat and its stock unit are "
            "free at once; a leader hands the team to the earliest remaining member, the last "
            "member fails it (`abandoned`). Formed team: it stays formed and lists the member "
            "with `refunded_at` (`refunded`: true), the unit comes back. The same user and "
            "order again: the same answer, the team as it is now"
        },
        answer=wire.MemberLeft,
        problems={
            errors.NotAMember: "the user is not a member of this team",
            errors.OrderMismatch: "the member joined with another order, or with one and "
            "none was given (or the other way round)",
            errors.TeamFailed: "the team failed: its members were refunded by the failure",
            errors.DatabaseUnavailable: "the change is not recorded in SQL yet (the database "
            "is down, locked or slow): it is made in Redis; retry the same call, which "
            "answers 200 once the record is in SQL",
            **NO_TEAM_PROBLEMS,
        },
    ),
    Endpoint(
        "POST",
        "/v1/admin/activities/{activity_id}/teams/{team_id}/dissolve",
        dissolve_team,
        "Dissolve an open team: it fails now (`reason`: dissolved)",
        role="admin",
        body=TeamDissolve,
        tag="admin",
        responses={
            200: "The team failed now: its `team.failed` event carries `reason: dissolved` "
            "and lists its members to refund; its live locks are dropped. A repeat answers "
            "the same (the team as it is now)"
        },
        answer=wire.Dissolved,
        problems={
            errors.TeamFormed: "the team is formed: it cannot be dissolved",
            errors.TeamFailed: "the team failed otherwise (its deadline passed, or its last "
            "member left)",
            **NO_TEAM_PROBLEMS,
        },
        audit="team.dissolve",
    ),
    Endpoint(
        "GET",
        "/v1/activities/{activity_id}/users/{user_id}/lock",
        get_user_lock,
        "A user's current lock in an activity",
        rate_class="read",
        rate_user="user_id",
        tag="teams",
        responses={200: "The user's unexpired lock"},
        answer=wire.UserLock,
        problems={
            errors.NoLock: "the user holds no unexpired lock in the activity",
            **NO_ACTIVITY_PROBLEMS,
        },
    ),
]
