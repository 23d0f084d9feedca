"""Rebuilding in Redis what it lost (a restart without persistence, an eviction), from SQL.

The live calls reach this through one object, `TeamRecovery`: `bring_back` a team or
`bring_back_activity` when a script found nothing, then call again. The repair job's
pass over SQL's open teams (`restore_missing`) is here too.
"""

from __future__ import annotations

import logging
from typing import Any

from groupbuy_client.wire import to_ms
from sqlalchemy import select, tuple_

from groupbuy.locks.activity_copy import ActivityCopy
from groupbuy.locks.codec import FIELD, member_value
from groupbuy.locks.codes import TeamCode
from groupbuy.locks.history import recorded_members
from groupbuy.locks.models import ActivityRow, TeamRow
from groupbuy.locks.scripts import TeamScripts
from groupbuy.metrics import RESTORED
from groupbuy.settings import TeamSettings
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.restore import rebuilding

log = logging.getLogger(__name__)


class TeamRecovery(UsesBackends):
    """Puts an activity's copy or an open team back in Redis from its SQL record."""

    def __init__(
        self,
        backends: Backends,
        defaults: TeamSettings,
        scripts: TeamScripts,
        activities: ActivityCopy,
    ) -> None:
        super().__init__(backends)
        self._defaults = defaults
        self._teams = scripts
        self._activities = activities
        self._restore_after: tuple[str, str] = ("", "")  # the repair job's next page

    async def bring_back_activity(self, activity_id: str) -> None:
        """Put the activity's copy back in Redis from SQL (ActivityNotFound when unknown)."""
        await self._activities.put(await self._activities.row(activity_id))

    async def bring_back(self, activity_id: str, team_id: str) -> bool:
        """Rebuild the team in Redis if SQL knows it as open; False when it is not (unknown
        or ended: its SQL record is the answer)."""
        async with self._db.sessions() as session:
            team = await session.get(TeamRow, (activity_id, team_id))
        if team is None or team.status != "open":
            return False
        await self.restore(activity_id, team_id)
        return True

    async def restore(self, activity_id: str, team_id: str) -> bool:
        """Rebuild an open team that Redis lost, from SQL; True if this call rebuilt it.

        Its recorded members, deadline and indexes come back; its seat locks do not (they
        lived only in Redis): the shoppers who held one lock again. Members who left stay
        out of it, remembered as having left (their repeat answers the same). A team past
        its deadline fails on its next call, as it would have.
        """
        keys = self._keys
        async with rebuilding(
            self._redis, keys.team_restoring(activity_id, team_id), keys.team(activity_id, team_id)
        ) as needed:
            if not needed:
                return False
            async with self._db.sessions() as session:
                team = await session.get(TeamRow, (activity_id, team_id))
                activity = await session.get(ActivityRow, activity_id)
                if team is None or activity is None or team.status != "open":
                    return False
                members = await recorded_members(session, activity_id, team_id)
                # The rebuild is a change of its own: after every change SQL has seen.
                version = team.version + 1
            await self._activities.put(activity)
            recorded: list[Any] = []
            left: list[str] = []
            leader_order = ""
            for m in members:
                if m.left_at is not None:  # out of the team, but remembered (team_leave)
                    left.append(FIELD.join((m.user_id, str(to_ms(m.left_at)), m.order_id or "")))
                    continue
                recorded += [m.user_id, member_value(m.seq, to_ms(m.joined_at), m.order_id)]
                if m.user_id == team.leader_id:
                    leader_order = m.order_id or ""
            # A new member's seq follows every recorded one, of those who left too.
            departed = max((m.seq for m in members), default=0) - len(recorded) // 2
            reply = await self._teams.restore(
                activity_id,
                team_id,
                recorded,
                leader_id=team.leader_id,
                leader_order_id=leader_order,
                size=team.size,
                lock_ttl_ms=activity.lock_ttl_s * 1000,
                created_ms=to_ms(team.created_at),
                deadline_ms=to_ms(team.deadline_at),
                retention_ms=self._defaults.retention_s * 1000,
                version=version,
                virtual_min=activity.virtual_min_members or 0,
                teams_limit=activity.teams_per_user or 0,
                led_limit=activity.open_teams_per_leader or 0,
                departed=departed,
                left_members=",".join(left),
            )
        if reply.code is not TeamCode.OK:
            return False
        RESTORED.labels("team").inc()
        log.warning(
            "team %s of activity %s was missing from Redis: rebuilt from SQL with its %d "
            "recorded members (its seat locks are gone)",
            team_id,
            activity_id,
            len(recorded) // 2,
        )
        return True

    async def restore_missing(self, page: int, limit: int) -> int:
        """Rebuild the open teams of the next page of SQL's that Redis does not hold (at most
        `limit`); the repair job's pass after a loss of Redis data. Returns how many."""
        after_activity, after_team = self._restore_after
        async with self._db.sessions() as session:
            rows = (
                await session.execute(
                    select(TeamRow.activity_id, TeamRow.team_id)
                    .where(
                        TeamRow.status == "open",
                        tuple_(TeamRow.activity_id, TeamRow.team_id) > (after_activity, after_team),
                    )
                    .order_by(TeamRow.activity_id, TeamRow.team_id)
                    .limit(page)
                )
            ).all()
        async with self._redis.pipeline(transaction=False) as pipe:
            for activity_id, team_id in rows:
                pipe.exists(self._keys.team(activity_id, team_id))
            present = await pipe.execute() if rows else []
        missing = [(a, t) for (a, t), there in zip(rows, present, strict=True) if not there]
        restored = 0
        for activity_id, team_id in missing[:limit]:
            restored += await self.restore(activity_id, team_id)
        if len(missing) <= limit:
            self._restore_after = (rows[-1][0], rows[-1][1]) if len(rows) == page else ("", "")
        return restored
