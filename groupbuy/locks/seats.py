"""The hot path of the group-buy engine: seat locks, joins, confirms (no HTTP in here).

Redis holds the live state and decides every change in one Lua script; the script writes
the change's record to the activity's outbox stream in the same atomic call, and only a
confirm waits for that record to reach SQL. When a script finds no team or activity,
Redis may have lost it: the `MissingTeam` hook (TeamRecovery) brings it back from SQL,
and the call is made again; a team Redis let go after it ended answers from its SQL
record (`TeamHistory`).
"""

from __future__ import annotations

from typing import Any

from groupbuy import errors
from groupbuy.locks.activity_copy import ActivityCopy
from groupbuy.locks.codes import LOCKED, TeamCode, raise_for
from groupbuy.locks.history import MissingTeam, TeamHistory
from groupbuy.locks.join import SeatJoin
from groupbuy.locks.lock import SeatLock
from groupbuy.locks.refusals import refuse_for_user
from groupbuy.locks.scripts import TeamScripts
from groupbuy.locks.unlock import SeatUnlock
from groupbuy.locks.view import TeamView
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.outcome import Outcome
from groupbuy.settings import TeamSettings
from groupbuy.storage.timefmt import iso_ms


class SeatService:
    """Seat locks and membership: lock, join, unlock, confirm, and a user's current lock."""

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
        self._outbox = outbox
        self._defaults = defaults
        self._activities = activities
        self._history = history
        self._recovery = recovery
        # The operations whole in their own modules (groupbuy.locks.lock, .unlock, .join).
        self.lock = SeatLock(scripts, history, recovery)
        self.unlock = SeatUnlock(scripts, history)
        self.join = SeatJoin(scripts, defaults, recovery)

    async def confirm(self, activity_id: str, team_id: str, user_id: str, order_id: str) -> Outcome:
        """Payment succeeded: the user's lock becomes membership; a repeat returns the same."""
        reply = await self._teams.confirm(activity_id, team_id, user_id, order_id)
        if reply.code is TeamCode.TEAM_NOT_FOUND and await self._recovery.bring_back(
            activity_id, team_id
        ):
            reply = await self._teams.confirm(activity_id, team_id, user_id, order_id)
        if reply.code is TeamCode.TEAM_NOT_FOUND:
            return await self._history.confirmed_before(activity_id, team_id, user_id, order_id)
        refuse_for_user(reply, user_id)
        if reply.code not in LOCKED:
            raise_for(reply.code)
        # The answer waits for the membership's record in SQL. The script has made the user
        # a member in Redis (no lock left to expire) and written the record to the outbox in
        # the same call: SQL away, this raises (503 database_unavailable), the record waits
        # in Redis, and the backend's retry answers EXISTING once a flush has it in SQL.
        await self._outbox.drain(activity_id)
        # `formed` is this confirm's own: true for exactly one confirm per team (and its
        # repeats), so a backend can say "your team is complete" once.
        team = TeamView.from_snapshot(activity_id, team_id, reply.team)
        body = {"team": team.body(), "formed": reply.formed}
        return Outcome(body, reply.code is TeamCode.OK)

    async def current_lock(self, activity_id: str, user_id: str) -> dict[str, Any]:
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
