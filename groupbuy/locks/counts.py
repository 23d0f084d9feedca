"""An activity's live counts: read from Redis in one script call, put back from SQL when
Redis has none (a new activity, or after a loss of Redis data)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy import and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.specs import COUNTS, WAITLIST_COUNTS
from groupbuy.storage.backends import Backends, UsesBackends

# An activity's live counts as its API body carries them (members: of open and formed
# teams, leaders included), and `now_ms`: Redis's clock when they were read (the
# activity's status is judged on it; groupbuy.locks.bodies.activity_body).
Counts = dict[str, int]

# How long Redis keeps its copy of an activity after it was last put there. The repair
# job drops it sooner once the activity's last live team has ended. Counts put while no
# team of the activity lives in Redis expire with the copy (activity_counts_put).
ACTIVITY_COPY_TTL_MS = 86_400_000


async def recorded_counts(session: AsyncSession, activity_id: str) -> dict[str, int]:
    """The activity's counts as SQL records them (no live lock: none outlives Redis)."""
    return (await recorded_counts_of(session, [activity_id]))[activity_id]


async def recorded_counts_of(
    session: AsyncSession, activity_ids: Sequence[str]
) -> dict[str, dict[str, int]]:
    """The counts SQL records of each activity: three statements whatever their number."""
    # One row per activity (a page's worth at most): each status summed in its own column.
    by_status = {
        activity_id: (int(open_ or 0), int(formed or 0), int(failed or 0))
        for activity_id, open_, formed, failed in await session.execute(
            select(
                TeamRow.activity_id,
                *(
                    func.sum(case((TeamRow.status == status, 1), else_=0))
                    for status in ("open", "formed", "failed")
                ),
            )
            .where(TeamRow.activity_id.in_(activity_ids))
            .group_by(TeamRow.activity_id)
        )
    }
    joined = and_(
        MemberRow.activity_id == TeamRow.activity_id, MemberRow.team_id == TeamRow.team_id
    )
    members = dict(
        (
            await session.execute(
                select(TeamRow.activity_id, func.count())
                .select_from(MemberRow)
                .join(TeamRow, joined)
                .where(
                    TeamRow.activity_id.in_(activity_ids),
                    TeamRow.status.in_(("open", "formed")),
                    # who left or was refunded holds no unit (as the scripts' tally)
                    MemberRow.left_at.is_(None),
                    MemberRow.refunded_at.is_(None),
                )
                .group_by(TeamRow.activity_id)
            )
        ).all()
    )
    # A team formed with fewer members than seats was formed by virtual completion.
    seated = select(func.count()).where(joined, MemberRow.left_at.is_(None)).scalar_subquery()
    virtual = dict(
        (
            await session.execute(
                select(TeamRow.activity_id, func.count())
                .where(
                    TeamRow.activity_id.in_(activity_ids),
                    TeamRow.status == "formed",
                    TeamRow.size > seated,
                )
                .group_by(TeamRow.activity_id)
            )
        ).all()
    )
    return {
        aid: {
            "teams_open": by_status.get(aid, (0, 0, 0))[0],
            "teams_formed": by_status.get(aid, (0, 0, 0))[1],
            "teams_failed": by_status.get(aid, (0, 0, 0))[2],
            "members": int(members.get(aid, 0)),
            "virtual_completions": int(virtual.get(aid, 0)),
        }
        for aid in activity_ids
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
        await self._put(activity_id, counts)

    async def _put(self, activity_id: str, counts: Counts) -> None:
        """SQL's counts into Redis unless it has some; they expire with the activity's copy
        until a team of it lives in Redis (nothing else would delete them)."""
        await self._teams.put_counts(activity_id, {**counts, "ttl_ms": ACTIVITY_COPY_TTL_MS})

    async def read_many(self, activity_ids: Sequence[str]) -> list[Counts]:
        """The counts of many activities (a listing's page): one script call each, sent
        together, and SQL's counts of those Redis has none of read in one go."""
        replies = await asyncio.gather(
            *(self._teams.counts(aid, self._candidates) for aid in activity_ids)
        )
        missing = [
            aid
            for aid, reply in zip(activity_ids, replies, strict=True)
            if reply.code is TeamCode.ACTIVITY_NOT_FOUND
        ]
        if missing:
            async with self._db.sessions() as session:
                recorded = await recorded_counts_of(session, missing)
            await asyncio.gather(*(self._put(aid, recorded[aid]) for aid in missing))
        return list(
            await asyncio.gather(
                *(
                    _done(_counts(reply)) if reply.code is TeamCode.OK else self.read(aid)
                    for aid, reply in zip(activity_ids, replies, strict=True)
                )
            )
        )

    async def read(self, activity_id: str) -> Counts:
        """The activity's counts now (time applied where it is due)."""
        rebuilt = False
        while True:
            reply = await self._teams.counts(activity_id, self._candidates)
            if reply.code is TeamCode.OK:
                return _counts(reply)
            if reply.code is TeamCode.ACTIVITY_NOT_FOUND and not rebuilt:
                await self.put_from_sql(activity_id)
                rebuilt = True
            elif reply.code is not TeamCode.LOOK_FURTHER:
                # Only a bug answers anything else (put_counts leaves counts in place).
                raise ValueError(f"activity_counts answered {reply.code.name}")
            # LOOK_FURTHER: the call applied time to `candidates` teams; the next goes further.


def _counts(reply: TeamReply) -> Counts:
    """activity_counts' OK: the counts as the activity's API body carries them, and now_ms."""
    counts = {name: int(reply.fields[name]) for name in (*COUNTS, "now_ms", *WAITLIST_COUNTS)}
    oldest = reply.fields["oldest_entry_expires_ms"]
    counts["oldest_entry_expires_ms"] = -1 if oldest is None else int(oldest)
    return counts


async def _done(counts: Counts) -> Counts:
    return counts
