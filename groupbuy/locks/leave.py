"""The leave, whole: the shop refunded a member (team_leave).

Out of an open team, the member leaves: the seat and its stock unit are free at once, a
leader hands the team to the earliest remaining member, and the last member's leave fails
the team (`abandoned`). In a formed team, the member stays listed with `refunded_at` and the
stock unit comes back. Its script's spec, its script call and the operation (`SeatLeave`,
which the seat service hands out as `seats.leave`) with its answer. Like a confirm, the
answer waits for the change's record in SQL.
"""

from __future__ import annotations

from groupbuy_client.wire import MemberLeft

from groupbuy.locks.codes import LOCKED, TeamCode, raise_for
from groupbuy.locks.history import MissingTeam, TeamHistory
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.specs import (
    EXISTING,
    FAILED,
    NO_TEAM,
    OK,
    TEAM,
    TEAM_ARGV,
    TEAM_KEYS,
    TEAM_NOT_FOUND,
    C,
)
from groupbuy.locks.view import TeamView
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.storage.specs import ScriptSpec, shape, slots

_LEFT = (("kind", str), TEAM)
TEAM_LEAVE = ScriptSpec(
    "team_leave",
    "The shop refunded a member: out of an open team, or listed refunded in a formed one.",
    keys=TEAM_KEYS,
    args=(
        *TEAM_ARGV,
        *slots(
            ("user_id", "the member"),
            ("order_id", "the member's order ('' for none)"),
            ("reason", "the shop's reason ('' for none)"),
        ),
    ),
    replies={
        OK: shape("done now; kind: 'left' (open team) or 'refunded' (formed team)", *_LEFT),
        EXISTING: shape("the same user and order left before", *_LEFT),
        C.NOT_A_MEMBER: shape("the user is not a member of the team"),
        C.ORDER_MISMATCH: shape("the member joined with another order (or none)"),
        C.TEAM_FAILED: FAILED,
        TEAM_NOT_FOUND: NO_TEAM,
    },
)


async def team_leave(
    teams: TeamScripts,
    activity_id: str,
    team_id: str,
    user_id: str,
    order_id: str | None,
    reason: str | None,
) -> TeamReply:
    """team_leave."""
    keys = TEAM_LEAVE.key_list(*teams.team(activity_id, team_id))
    args = teams.team_args(
        activity_id, team_id, user_id=user_id, order_id=order_id or "", reason=reason or ""
    )
    return await TEAM_LEAVE.run(teams.caller, keys, args)


class SeatLeave:
    """A refunded member leaves: `await seats.leave(activity_id, team_id, user_id, ...)`."""

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
        self,
        activity_id: str,
        team_id: str,
        user_id: str,
        order_id: str | None = None,
        reason: str | None = None,
    ) -> MemberLeft:
        """The member leaves (open team) or is refunded (formed team); a repeat of the same
        user and order answers the same."""
        args = (activity_id, team_id, user_id, order_id, reason)
        reply = await team_leave(self._teams, *args)
        if reply.code is TeamCode.TEAM_NOT_FOUND and await self._recovery.bring_back(
            activity_id, team_id
        ):
            reply = await team_leave(self._teams, *args)
        if reply.code is TeamCode.TEAM_NOT_FOUND:
            return await self._history.left_before(activity_id, team_id, user_id, order_id)
        if reply.code not in LOCKED:
            raise_for(reply.code)
        # As a confirm: the script changed Redis and wrote the record in the same call; the
        # answer waits for SQL (503 database_unavailable while it is away), and the retry
        # answers EXISTING once a flush has the record in SQL.
        await self._outbox.committed(activity_id)
        return leave_body(reply.kind, TeamView.from_snapshot(activity_id, team_id, reply.team))


def leave_body(kind: str, team: TeamView) -> MemberLeft:
    """The answer of a leave: `left` out of an open team, `refunded` in a formed one."""
    if kind == "refunded":
        return {"team": team.body(), "refunded": True}
    return {"team": team.body(), "left": True}
