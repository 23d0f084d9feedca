"""The unlock, whole: release a user's seat lock on a team (team_unlock).

Its script's spec, its script call and the operation (`SeatUnlock`, which the seat service
hands out as `seats.unlock`; its answer is whether a live lock was released).
"""

from __future__ import annotations

from groupbuy.locks.codes import TeamCode, raise_for
from groupbuy.locks.funnel import counts_release
from groupbuy.locks.history import TeamHistory
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.specs import (
    NO_TEAM,
    OK,
    TEAM_ARGV,
    TEAM_KEYS,
    TEAM_NOT_FOUND,
    USER_LOCK_SLOT,
)
from groupbuy.storage.specs import ScriptSpec, flag, shape, slots

TEAM_UNLOCK = ScriptSpec(
    "team_unlock",
    "Release a user's seat lock on a team (idempotent).",
    keys=(*TEAM_KEYS, *slots(USER_LOCK_SLOT)),
    args=(*TEAM_ARGV, *slots(("user_id", "the user"))),
    replies={
        OK: shape("released: 1 a live lock was released, 0 there was none", ("released", flag)),
        TEAM_NOT_FOUND: NO_TEAM,
    },
)


async def team_unlock(
    teams: TeamScripts, activity_id: str, team_id: str, user_id: str
) -> TeamReply:
    """team_unlock."""
    keys = TEAM_UNLOCK.key_list(
        *teams.team(activity_id, team_id), user_lock=teams.keys.user_lock(activity_id, user_id)
    )
    args = teams.team_args(activity_id, team_id, user_id=user_id)
    return await TEAM_UNLOCK.run(teams.caller, keys, args)


class SeatUnlock:
    """Release a seat lock: `await seats.unlock(activity_id, team_id, user_id)`."""

    def __init__(self, teams: TeamScripts, history: TeamHistory) -> None:
        self._teams = teams
        self._history = history

    @counts_release
    async def __call__(self, activity_id: str, team_id: str, user_id: str) -> bool:
        """Release the user's lock on the team; False when there was none."""
        reply = await team_unlock(self._teams, activity_id, team_id, user_id)
        if reply.code is TeamCode.TEAM_NOT_FOUND:
            await self._history.team(activity_id, team_id)  # raises when unknown
            return False
        if reply.code is not TeamCode.OK:
            raise_for(reply.code)
        return bool(reply.released)
