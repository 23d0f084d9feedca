"""The extension, whole: the payment is taking longer, so a user's live seat lock on a team
expires later (team_extend).

Its script's spec, its script call, the operation (`SeatExtend`, which the seat service
hands out as `seats.extend`) and its answer (`extend_outcome`: the lock's body, as a lock
answers it). How an extended lock is kept in Redis: "Extended locks" in lua/_team_lib.lua.
"""

from __future__ import annotations

from groupbuy_client.wire import LockTaken, iso_ms

from groupbuy import errors
from groupbuy.locks.codes import TeamCode, raise_for
from groupbuy.locks.history import MissingTeam, TeamHistory
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.specs import (
    ACTIVITY_NOT_FOUND,
    NO_ACTIVITY,
    NO_TEAM,
    OK,
    TEAM_ARGV,
    TEAM_KEYS,
    TEAM_NOT_FOUND,
    USER_LOCK_SLOT,
    C,
)
from groupbuy.storage.specs import ScriptSpec, flag, shape, slots

TEAM_EXTEND = ScriptSpec(
    "team_extend",
    "Let a user's live seat lock expire at locked_at + hold_ms (never after the deadline).",
    keys=(
        *TEAM_KEYS,
        *slots(USER_LOCK_SLOT),
    ),
    args=(
        *TEAM_ARGV,
        *slots(("user_id", "the user"), ("hold_ms", "how long after locked_at it expires")),
    ),
    replies={
        OK: shape(
            "the lock after the call; extended: whether this call moved its expiry",
            ("locked_at_ms", int),
            ("expires_at_ms", int),
            ("version", int),
            ("extended", flag),
            given=("team_id",),
        ),
        C.INVALID_REQUEST: shape(
            "hold_ms outside the activity's bounds (nothing changed)",
            ("min_hold_ms", int),
            ("max_hold_ms", int),
        ),
        C.LOCK_REQUIRED: shape("the user holds no live lock on this team"),
        TEAM_NOT_FOUND: NO_TEAM,
        ACTIVITY_NOT_FOUND: NO_ACTIVITY,
    },
)


async def team_extend(
    teams: TeamScripts, activity_id: str, team_id: str, user_id: str, hold_ms: int
) -> TeamReply:
    """team_extend."""
    keys = TEAM_EXTEND.key_list(
        *teams.team(activity_id, team_id),
        user_lock=teams.keys.user_lock(activity_id, user_id),
    )
    args = teams.team_args(activity_id, team_id, user_id=user_id, hold_ms=hold_ms)
    return await TEAM_EXTEND.run(teams.caller, keys, args, team_id=team_id)


class SeatExtend:
    """Extend a seat lock: `await seats.extend(activity_id, team_id, user_id, hold_s)`."""

    def __init__(self, teams: TeamScripts, history: TeamHistory, recovery: MissingTeam) -> None:
        self._teams = teams
        self._history = history
        self._recovery = recovery

    async def __call__(
        self, activity_id: str, team_id: str, user_id: str, hold_s: int
    ) -> LockTaken:
        """The user's live lock on the team, expiring `hold_s` after it was taken (at the
        deadline at the latest); a hold that would shorten it leaves it as it is."""
        reply = await team_extend(self._teams, activity_id, team_id, user_id, hold_s * 1000)
        if reply.code is TeamCode.ACTIVITY_NOT_FOUND:
            # The activity's copy expired or was lost while a team lives (404 when SQL does
            # not know the activity either).
            await self._recovery.bring_back_activity(activity_id)
            reply = await team_extend(self._teams, activity_id, team_id, user_id, hold_s * 1000)
        if reply.code is TeamCode.TEAM_NOT_FOUND:
            # A team rebuilt from SQL has no locks; one SQL has ended holds none either.
            await self._recovery.bring_back(activity_id, team_id)
            await self._history.team(activity_id, team_id)  # raises when unknown
            raise_for(TeamCode.LOCK_REQUIRED, f"user {user_id!r} holds no lock on this team")
        if reply.code is TeamCode.INVALID_REQUEST:
            low, high = reply.min_hold_ms // 1000, reply.max_hold_ms // 1000
            raise errors.InvalidRequest(
                f"hold_s must be between {low} (lock_ttl_s) and {high} (max_hold_s)",
                min_hold_s=low,
                max_hold_s=high,
            )
        if reply.code is not TeamCode.OK:
            raise_for(reply.code, f"user {user_id!r} holds no live lock on team {team_id!r}")
        return extend_outcome(user_id, reply)


def extend_outcome(user_id: str, extended: TeamReply) -> LockTaken:
    """The answer of an extension: the lock's body with its expiry and the team's version
    after the call (unchanged when the call changed nothing)."""
    return {
        "status": "locked",
        "user_id": user_id,
        "team_id": extended.team_id,
        "locked_at": iso_ms(extended.locked_at_ms),
        "expires_at": iso_ms(extended.expires_at_ms),
        "released_team_id": None,
        "version": extended.version,
    }
