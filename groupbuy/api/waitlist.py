"""HTTP endpoints of the waitlist (parse, call the team engine's waitlist, answer)."""

from __future__ import annotations

from groupbuy_client import wire
from starlette.requests import Request
from starlette.responses import Response

from groupbuy import errors
from groupbuy.api.endpoints import Endpoint, Id, StrictBody, json_response
from groupbuy.api.teams import (
    BLOCKED_PROBLEMS,
    CLOSED_PROBLEMS,
    ENDED_PROBLEMS,
    NO_ACTIVITY_PROBLEMS,
    NO_TEAM_PROBLEMS,
    OVER_LIMIT_PROBLEMS,
)
from groupbuy.locks.engine import TeamEngine


class WaitlistJoin(StrictBody):
    """Body of POST .../waitlist."""

    user_id: Id
    team_id: Id | None = None


def _teams(request: Request) -> TeamEngine:
    teams: TeamEngine = request.app.state.services.teams
    return teams


# A lock now (201 new, 200 the user's existing one), a place in line (202), the offer (200).
_STATUS = {"queued": 202, "offered": 200}


async def join_waitlist(request: Request, body: WaitlistJoin) -> Response:
    outcome = await _teams(request).waitlist.join(
        request.path_params["activity_id"], body.user_id, body.team_id
    )
    status = _STATUS.get(outcome.body["status"], 201 if outcome.created else 200)
    return json_response(outcome.body, status)


async def get_waitlist_entry(request: Request) -> Response:
    p = request.path_params
    return json_response(await _teams(request).waitlist.read(p["activity_id"], p["user_id"]))


async def leave_waitlist(request: Request) -> Response:
    p = request.path_params
    removed = await _teams(request).waitlist.leave(p["activity_id"], p["user_id"])
    return json_response({"removed": removed})


_WAITLIST = "/v1/activities/{activity_id}/waitlist"

ENDPOINTS = [
    Endpoint(
        "POST",
        _WAITLIST,
        join_waitlist,
        "Wait in line for the next free seat",
        rate_class="seat",
        rate_user="user_id",
        body=WaitlistJoin,
        tag="waitlist",
        responses={
            201: "A seat was free and nobody waited: a new lock, as a lock (`team_id` given) "
            "or a join answers it",
            200: "The user's existing lock, or the lock the line offered (`status` offered; "
            "also at once, when a seat came free as the entry queued)",
            202: "Queued (or a repeat: the same entry): `position` 1 is next; the offer "
            "arrives as the event lock.offered",
        },
        answer=wire.WaitlistAnswer,
        problems={
            **CLOSED_PROBLEMS,
            errors.ActivityNotStarted: "before the sale's `starts_at` (carried)",
            errors.ActivityEnded: "the sale's `ends_at` has passed",
            errors.WaitlistFull: "the activity's lines hold `max_len` entries",
            errors.AlreadyLocked: "the user holds a live lock in the activity (`team_id`)",
            errors.AlreadyMember: "the user is a member of this team",
            errors.LeftTeam: "the user left this team: no seat in it again",
            **OVER_LIMIT_PROBLEMS,
            **BLOCKED_PROBLEMS,
            **ENDED_PROBLEMS,
            errors.Conflict: "the seats kept changing during every attempt; retry",
            **NO_TEAM_PROBLEMS,
        },
    ),
    Endpoint(
        "GET",
        f"{_WAITLIST}/{{user_id}}",
        get_waitlist_entry,
        "A user's place in line, or the lock the line offered",
        rate_class="read",
        tag="waitlist",
        responses={200: "`status` queued (with `position`) or offered (the lock)"},
        answer=wire.WaitlistEntry,
        problems={
            errors.NotWaiting: "the user is not waiting and holds no live offer",
            **NO_ACTIVITY_PROBLEMS,
        },
    ),
    Endpoint(
        "DELETE",
        f"{_WAITLIST}/{{user_id}}",
        leave_waitlist,
        "Leave the line (an offered lock stays: release it with DELETE .../locks/{user_id})",
        rate_class="seat",
        rate_user="user_id",
        tag="waitlist",
        responses={200: "Done, removed or not (idempotent)"},
        answer=wire.WaitlistRemoved,
    ),
]
