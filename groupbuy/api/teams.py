"""HTTP endpoints of activities, teams and seat locks (parse, call TeamService, answer)."""

from __future__ import annotations

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from groupbuy.api.endpoints import Endpoint, Id, StrictBody, created_response, json_response
from groupbuy.locks.service import TeamService
from groupbuy.settings import LockTtlS, TeamDeadlineS, TeamSize


class ActivityCreate(StrictBody):
    """Body of POST /v1/activities (omitted numbers take the configured defaults)."""

    activity_id: Id
    name: str | None = Field(default=None, max_length=200)
    team_size: TeamSize | None = None
    lock_ttl_s: LockTtlS | None = None
    team_deadline_s: TeamDeadlineS | None = None


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


def _service(request: Request) -> TeamService:
    service: TeamService = request.app.state.services.teams
    return service


async def create_activity(request: Request, body: ActivityCreate) -> Response:
    return created_response(await _service(request).create_activity(**body.model_dump()))


async def get_activity(request: Request) -> Response:
    return json_response(await _service(request).get_activity(request.path_params["activity_id"]))


async def open_team(request: Request, body: TeamOpen) -> Response:
    outcome = await _service(request).open_team(
        request.path_params["activity_id"], **body.model_dump()
    )
    return created_response(outcome)


async def get_team(request: Request) -> Response:
    p = request.path_params
    return json_response(await _service(request).get_team(p["activity_id"], p["team_id"]))


async def lock_seat(request: Request, body: LockRequest) -> Response:
    p = request.path_params
    return created_response(
        await _service(request).lock(p["activity_id"], p["team_id"], body.user_id)
    )


async def unlock_seat(request: Request) -> Response:
    p = request.path_params
    released = await _service(request).unlock(p["activity_id"], p["team_id"], p["user_id"])
    return json_response({"released": released})


async def confirm_member(request: Request, body: MemberConfirm) -> Response:
    p = request.path_params
    outcome = await _service(request).confirm(
        p["activity_id"], p["team_id"], body.user_id, body.order_id
    )
    return created_response(outcome)


async def get_user_lock(request: Request) -> Response:
    p = request.path_params
    return json_response(await _service(request).current_lock(p["activity_id"], p["user_id"]))


_TEAM = "/v1/activities/{activity_id}/teams/{team_id}"
_NOT_FOUND = {404: "activity_not_found / team_not_found"}

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
            201: "The activity",
            200: "Same id and parameters: the original",
            409: "conflict: the id exists with other parameters",
        },
    ),
    Endpoint(
        "GET",
        "/v1/activities/{activity_id}",
        get_activity,
        "Read an activity",
        tag="activities",
        responses={200: "The activity", 404: "activity_not_found"},
    ),
    Endpoint(
        "POST",
        "/v1/activities/{activity_id}/teams",
        open_team,
        "Open a team (leader is member 1)",
        body=TeamOpen,
        tag="teams",
        responses={
            201: "The team",
            200: "Same team id, leader and order: the team",
            409: "conflict: the team id exists with another leader or order",
            404: "activity_not_found",
        },
    ),
    Endpoint(
        "GET",
        _TEAM,
        get_team,
        "Read a team",
        tag="teams",
        responses={200: "The team", **_NOT_FOUND},
    ),
    Endpoint(
        "POST",
        f"{_TEAM}/locks",
        lock_seat,
        "Lock a free seat for a user",
        body=LockRequest,
        tag="teams",
        responses={
            201: "A new lock (released_team_id names a lock given up for it)",
            200: "The user's existing unexpired lock, unchanged",
            409: "team_full / already_member / team_formed / team_failed",
            **_NOT_FOUND,
        },
    ),
    Endpoint(
        "DELETE",
        f"{_TEAM}/locks/{{user_id}}",
        unlock_seat,
        "Release a user's seat lock",
        tag="teams",
        responses={200: "{released: bool}", **_NOT_FOUND},
    ),
    Endpoint(
        "POST",
        f"{_TEAM}/members",
        confirm_member,
        "Payment succeeded: lock becomes membership",
        body=MemberConfirm,
        tag="teams",
        responses={
            201: "{team, formed}",
            200: "Same user and order again: the same result",
            409: "lock_required / already_member / team_formed / team_failed",
            **_NOT_FOUND,
        },
    ),
    Endpoint(
        "GET",
        "/v1/activities/{activity_id}/users/{user_id}/lock",
        get_user_lock,
        "A user's current lock in an activity",
        tag="teams",
        responses={200: "{team_id, locked_at, expires_at}", 404: "no_lock / activity_not_found"},
    ),
]
