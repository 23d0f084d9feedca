"""The hot path of the group-buy engine: seat locks, joins, confirms (no HTTP in here).

Each operation is whole in its own module (groupbuy.locks.lock, .unlock, .join, .confirm:
its script's spec, its script call, the operation and its answer); the seat service hands
them out (`seats.lock(...)`) and answers a user's current lock itself.

Redis holds the live state and decides every change in one Lua script; the script writes
the change's record to the activity's outbox stream in the same atomic call, and only a
confirm waits for that record to reach SQL. When a script finds no team or activity,
Redis may have lost it: the `MissingTeam` hook (TeamRecovery) brings it back from SQL,
and the call is made again; a team Redis let go after it ended answers from its SQL
record (`TeamHistory`).
"""

from __future__ import annotations

from groupbuy_client.wire import UserLock, iso_ms

from groupbuy import errors
from groupbuy.locks.activity_copy import ActivityCopy
from groupbuy.locks.codes import TeamCode, raise_for
from groupbuy.locks.confirm import SeatConfirm
from groupbuy.locks.extend import SeatExtend
from groupbuy.locks.history import MissingTeam, TeamHistory
from groupbuy.locks.join import SeatJoin
from groupbuy.locks.leave import SeatLeave
from groupbuy.locks.lock import SeatLock
from groupbuy.locks.scripts import TeamScripts
from groupbuy.locks.unlock import SeatUnlock
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.settings import TeamSettings


class SeatService:
    """Seat locks and membership: lock, join, unlock, confirm, leave, and a user's current
    lock."""

    def __init__(
        self,
        scripts: TeamScripts,
        outbox: TeamRecordWriter,
        defaults: TeamSettings,
        activities: ActivityCopy,
        history: TeamHistory,
        recovery: MissingTeam,
    ) -> None:
        self._teams = scripts
        self._activities = activities
        self.lock = SeatLock(scripts, history, recovery)
        self.unlock = SeatUnlock(scripts, history)
        self.join = SeatJoin(scripts, defaults, recovery)
        self.confirm = SeatConfirm(scripts, outbox, history, recovery)
        self.extend = SeatExtend(scripts, history, recovery)
        self.leave = SeatLeave(scripts, outbox, history, recovery)

    async def current_lock(self, activity_id: str, user_id: str) -> UserLock:
        """The user's unexpired lock in the activity, or NoLock (one script call)."""
        reply = await self._teams.user_lock(activity_id, user_id)
        if reply.code is TeamCode.NO_LOCK:
            await self._activities.row(activity_id)  # an unknown activity is a 404 of its own
            raise errors.NoLock(f"user {user_id!r} holds no lock in activity {activity_id!r}")
        if reply.code is not TeamCode.OK:
            raise_for(reply.code)
        return {
            "team_id": reply.team_id,
            "locked_at": iso_ms(reply.locked_at_ms),
            "expires_at": iso_ms(reply.expires_at_ms),
        }
