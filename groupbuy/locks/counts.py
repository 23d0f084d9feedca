"""An activity's live counts: read from Redis in one script call, put back from SQL when
Redis has none (a new activity, or after a loss of Redis data)."""

from __future__ import annotations

from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.locks.replies import Counts
from groupbuy.locks.scripts import TeamScripts
from groupbuy.storage.backends import Backends, UsesBackends


async def recorded_counts(session: AsyncSession, activity_id: str) -> dict[str, int]:
    """The activity's counts as SQL records them (no live lock: none outlives Redis)."""
    by_status = dict(
        (
            await session.execute(
                select(TeamRow.status, func.count())
                .where(TeamRow.activity_id == activity_id)
                .group_by(TeamRow.status)
            )
        ).all()
    )
    joined = and_(
        MemberRow.activity_id == TeamRow.activity_id, MemberRow.team_id == TeamRow.team_id
    )
    members = await session.scalar(
        select(func.count())
        .select_from(MemberRow)
        .join(TeamRow, joined)
        .where(TeamRow.activity_id == activity_id, TeamRow.status.in_(("open", "formed")))
    )
    # A team formed with fewer members than seats was formed by virtual completion.
    seated = select(func.count()).where(joined).scalar_subquery()
    virtual = await session.scalar(
        select(func.count())
        .select_from(TeamRow)
        .where(
            TeamRow.activity_id == activity_id, TeamRow.status == "formed", TeamRow.size > seated
        )
    )
    return {
        "teams_open": int(by_status.get("open", 0)),
        "teams_formed": int(by_status.get("formed", 0)),
        "teams_failed": int(by_status.get("failed", 0)),
        "members": int(members or 0),
        "virtual_completions": int(virtual or 0),
    }


class ActivityCounts(UsesBackends):
    """Reads an activity's live counts; puts them back from SQL when Redis has none."""

    def __init__(self, backends: Backends, scripts: TeamScripts, candidates: int) -> None:
        super().__init__(backends)
        self._teams = scripts
        self._candidates = candidates

    async def put_from_sql(self, activity_id: str) -> None:
        """Give Redis SQL's counts of the activity unless it has counts (then nothing changes).

        Called when the activity's copy is put (before any of its teams can be put back
        after a loss), so no team script counted a change that SQL's counts miss.
        """
        async with self._db.sessions() as session:
            counts = await recorded_counts(session, activity_id)
        await self._teams.put_counts(activity_id, counts)

    async def read(self, activity_id: str) -> Counts:
        """The activity's counts now (time applied where it is due)."""
        rebuilt = False
        while True:
            reply = await self._teams.counts(activity_id, self._candidates)
            if isinstance(reply, Counts):
                return reply
            if reply.code is TeamCode.ACTIVITY_NOT_FOUND and not rebuilt:
                await self.put_from_sql(activity_id)
                rebuilt = True
            elif reply.code is not TeamCode.LOOK_FURTHER:
                # Only a bug answers anything else (put_counts leaves counts in place).
                raise ValueError(f"activity_counts answered {reply.code.name}")
            # LOOK_FURTHER: the call applied time to `candidates` teams; the next goes further.
