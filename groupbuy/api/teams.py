"""HTTP endpoints of activities, teams and seat locks (parse, call the team engine, answer)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import Response

from groupbuy import errors
from groupbuy.api import answers
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
from groupbuy.settings import LockTtlS, TeamDeadlineS, TeamSize, UserLimit


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


class TeamOpen(StrictBody):
    """Body of POST .../teams."""

    leader_id: Id
    team_id: Id | None = None
    order_id: Id | None = None


class LockRequest(StrictBody):
    """Body of POST .../locks."""

    user_id: Id


class MemberConfirm(StrictBody):
    """Body of POST .../members: the payment of `order_id` succeeded."""

    user_id: Id
    order_id: Id


class TeamsQuery(LaxQuery):
    """Query of GET .../teams: a page of the open teams that have a free seat."""

    status: Literal["open"] = Field(
        default="open",
        description="only `open`: the list is the activity's open-seat index (read an ended "
        "team by its id)",
    )
    has_free_seats: bool = Field(
        default=True, description="only `true`: a full team is not listed until a seat frees"
    )
    limit: int = Field(default=20, ge=1, le=100, description="teams per page")
    cursor: str | None = Field(
        default=None,
        max_length=200,
        description="the `next_cursor` of the previous page; absent for the first page",
    )

    @field_validator("has_free_seats")
    @classmethod
    def _only_free_seats(cls, value: bool) -> bool:
        if not value:
            raise ValueError("only teams with a free seat are listed (true)")
        return value

    @field_validator("cursor")
    @classmethod
    def _cursor_of_this_list(cls, value: str | None) -> str | None:
        if value is not None:
            parse_page_cursor(value)  # ValueError: 422
        return value


def _teams(request: Request) -> TeamEngine:
    teams: TeamEngine = request.app.state.services.teams
    return teams


async def create_activity(request: Request, body: ActivityCreate) -> Response:
    virtual, limits = body.virtual_completion, body.limits or ActivityLimits()
    fields = body.model_dump(exclude={"virtual_completion", "limits"})
    outcome = await _teams(request).activities.create_activity(
        **fields,
        virtual_min_members=virtual.min_members if virtual else None,
        **limits.model_dump(),
    )
    return created_response(outcome)


async def get_activity(request: Request) -> Response:
    return json_response(
        await _teams(request).activities.get_activity(request.path_params["activity_id"])
    )


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
    page = await _teams(request).activities.list_open_teams(
        request.path_params["activity_id"], query.limit, query.cursor
    )
    return json_response(page)


async def unlock_seat(request: Request) -> Response:
    p = request.path_params
    released = await _teams(request).seats.unlock(p["activity_id"], p["team_id"], p["user_id"])
    return json_response({"released": released})


async def confirm_member(request: Request, body: MemberConfirm) -> Response:
    p = request.path_params
    outcome = await _teams(request).seats.confirm(
        p["activity_id"], p["team_id"], body.user_id, body.order_id
    )
    return created_response(outcome)


async def get_user_lock(request: Request) -> Response:
    p = request.path_params
    return json_response(await _teams(request).seats.current_lock(p["activity_id"], p["user_id"]))


_TEAM = "/v1/activities/{activity_id}/teams/{team_id}"
_NO_ACTIVITY: Problems = {errors.ActivityNotFound: "no activity has this id"}
_NO_TEAM: Problems = {errors.TeamNotFound: "the activity has no team with this id", **_NO_ACTIVITY}
_OVER_LIMIT: Problems = {
    errors.UserLimitReached: "the user is at one of the activity's limits: `limit`, `current` "
    "and `limit_name` (teams_per_user or open_teams_per_leader)"
}
_BLOCKED: Problems = {errors.UserBlocked: "an admin blocked the user (`user_id`)"}
_ENDED: Problems = {
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
        answer=answers.Activity,
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
        answer=answers.Activity,
        problems=_NO_ACTIVITY,
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
        answer=answers.Team,
        problems={
            errors.Conflict: "the team id exists with another leader or order",
            **_OVER_LIMIT,
            **_BLOCKED,
            **_NO_ACTIVITY,
        },
    ),
    Endpoint(
        "GET",
        "/v1/activities/{activity_id}/teams",
        list_teams,
        "List the open teams that have a free seat",
        rate_class="read",
        query=TeamsQuery,
        tag="teams",
        responses={
            200: "A page of teams, closest to forming first (most members + live locks, then "
            "the oldest), as `POST .../locks` would pick them; a page may hold fewer than "
            "`limit` teams while `next_cursor` is not null"
        },
        answer=answers.TeamsPage,
        problems=_NO_ACTIVITY,
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
        answer=answers.LockTaken,
        problems={
            errors.NoTeamAvailable: "no open team has a free seat for the user at this instant "
            "(a seat whose lock has expired counts as free); `next_unlock_at`: when the "
            "activity's earliest lock expires, or null. Open a new team instead",
            **_OVER_LIMIT,
            **_BLOCKED,
            **_NO_ACTIVITY,
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
        answer=answers.Team,
        problems=_NO_TEAM,
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
        answer=answers.LockTaken,
        problems={
            errors.TeamFull: "every seat is a member or an unexpired lock; `next_unlock_at` "
            "(when the earliest lock expires, null if all seats are members) and "
            "`earliest_locked_at`",
            errors.AlreadyMember: "the user is a member of this team",
            **_OVER_LIMIT,
            **_BLOCKED,
            **_ENDED,
            errors.Conflict: "the user's lock in another team kept changing during the "
            "switch; retry",
            **_NO_TEAM,
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
        answer=answers.Released,
        problems=_NO_TEAM,
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
        answer=answers.Confirmed,
        problems={
            errors.LockRequired: "the user holds no unexpired lock on this team (refund them)",
            errors.AlreadyMember: "the user joined this team with another order",
            errors.DatabaseUnavailable: "the membership is not recorded in SQL yet (the "
            "database is down, locked or slow): the seat stays the user's; retry the same "
            "confirm, which answers 200 once the record is in SQL (do not refund)",
            **_OVER_LIMIT,
            **_BLOCKED,
            **_ENDED,
            **_NO_TEAM,
        },
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
        answer=answers.UserLock,
        problems={
            errors.NoLock: "the user holds no unexpired lock in the activity",
            **_NO_ACTIVITY,
        },
    ),
]
