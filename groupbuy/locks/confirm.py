"""The confirm, whole: payment succeeded, the user's lock becomes membership (team_confirm).

Its script's spec, its script call and the operation (`SeatConfirm`, which the seat service
hands out as `seats.confirm`) with its answer: the team and whether this confirm formed it.
"""

from __future__ import annotations

from groupbuy_client.wire import Confirmed, Outcome

from groupbuy.locks.codes import LOCKED, TeamCode, raise_for
from groupbuy.locks.history import MissingTeam, TeamHistory
from groupbuy.locks.refusals import refuse_for_user
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.specs import (
    BLOCKED,
    EXISTING,
    FAILED,
    FORMED,
    LEFT,
    MEMBER,
    NO_TEAM,
    OK,
    OVER_LIMIT,
    TEAM,
    TEAM_ARGV,
    TEAM_KEYS,
    TEAM_NOT_FOUND,
    USER_BLOCKED,
    USER_LIMIT_REACHED,
    USER_LOCK_SLOT,
    C,
)
from groupbuy.locks.view import TeamView
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.storage.specs import ScriptSpec, flag, shape, slots

_CONFIRMED = (("formed", flag), TEAM)
TEAM_CONFIRM = ScriptSpec(
    "team_confirm",
    "Payment succeeded: turn the user's unexpired lock into membership (or, on an activity "
    "with late_confirm, join without one while a seat and a unit are free).",
    keys=(
        *TEAM_KEYS,
        *slots(USER_LOCK_SLOT),
    ),
    args=(*TEAM_ARGV, *slots(("user_id", "the user"), ("order_id", "the paid order"))),
    replies={
        OK: shape(
            "the user is a member now; formed: this confirm formed the team; late: joined "
            "without a live lock (late confirm)",
            ("formed", flag),
            ("late", flag),
            TEAM,
        ),
        EXISTING: shape("confirmed before (the same order)", *_CONFIRMED),
        C.ALREADY_MEMBER: MEMBER,
        C.LEFT_TEAM: LEFT,
        C.LOCK_REQUIRED: shape(
            "the user holds no unexpired lock on the team (and no late confirm took a seat)"
        ),
        C.TEAM_FORMED: FORMED,
        C.TEAM_FAILED: FAILED,
        TEAM_NOT_FOUND: NO_TEAM,
        USER_LIMIT_REACHED: OVER_LIMIT,
        USER_BLOCKED: BLOCKED,
    },
)


async def team_confirm(
    teams: TeamScripts, activity_id: str, team_id: str, user_id: str, order_id: str
) -> TeamReply:
    """team_confirm."""
    keys = TEAM_CONFIRM.key_list(
        *teams.team(activity_id, team_id),
        user_lock=teams.keys.user_lock(activity_id, user_id),
    )
    args = teams.team_args(activity_id, team_id, user_id=user_id, order_id=order_id)
    return await TEAM_CONFIRM.run(teams.caller, keys, args)


class SeatConfirm:
    """Confirm a paid seat: `await seats.confirm(activity_id, team_id, user_id, order_id)`."""

    def __init__(
        self,
        teams: TeamScripts,
        outbox: TeamRecordWriter,
        history: TeamHistory,
        recovery: MissingTeam,
    ) -> None:
        self._teams = teams
        self._outbox = outbox
        self._history = history
        self._recovery = recovery

    async def __call__(
        self, activity_id: str, team_id: str, user_id: str, order_id: str
    ) -> Outcome:
        """Payment succeeded: the user's lock becomes membership; a repeat returns the same."""
        reply = await team_confirm(self._teams, activity_id, team_id, user_id, order_id)
        if reply.code is TeamCode.TEAM_NOT_FOUND and await self._recovery.bring_back(
            activity_id, team_id
        ):
            reply = await team_confirm(self._teams, activity_id, team_id, user_id, order_id)
        if reply.code is TeamCode.TEAM_NOT_FOUND:
            return await self._history.confirmed_before(activity_id, team_id, user_id, order_id)
        refuse_for_user(reply, user_id)
        if reply.code not in LOCKED:
            raise_for(reply.code)
        # The answer waits for the membership's record in SQL. The script has made the user
        # a member in Redis (no lock left to expire) and written the record to the outbox in
        # the same call: SQL away, this raises (503 database_unavailable), the record waits
        # in Redis, and the backend's retry answers EXISTING once a flush has it in SQL.
        await self._outbox.committed(activity_id)
        # `formed` is this confirm's own: true for exactly one confirm per team (and its
        # repeats), so a backend can say "your team is complete" once.
        team = TeamView.from_snapshot(activity_id, team_id, reply.team)
        body: Confirmed = {"team": team.body(), "formed": reply.formed}
        if reply.code is TeamCode.OK and reply.late:
            body["late"] = True
        return Outcome(body, reply.code is TeamCode.OK)
