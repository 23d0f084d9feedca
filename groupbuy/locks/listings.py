"""Pages read from SQL alone: activities newest first, and an activity's ended teams.

Each page is one keyset query on an index of migration 0004 (no OFFSET, no scan): the
cursor is the (time, id) of the last row of the previous page, opaque to clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from groupbuy_client.wire import TeamsPage, from_ms, to_ms
from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import InstrumentedAttribute

from groupbuy import errors
from groupbuy.locks.bodies import activity_body
from groupbuy.locks.codec import page_cursor, parse_page_cursor
from groupbuy.locks.counts import ActivityCounts
from groupbuy.locks.history import members_of_teams
from groupbuy.locks.models import ActivityRow, ActivityRulesRow, TeamRow
from groupbuy.locks.view import TeamView
from groupbuy.storage.backends import Backends, UsesBackends

EndedStatus = Literal["formed", "failed"]


def _newest_first(
    query: Select[Any],
    at: InstrumentedAttribute[Any],
    key: InstrumentedAttribute[Any],
    cursor: str | None,
    limit: int,
) -> Select[Any]:
    """`query` ordered by (at, key) newest first, after the cursor's row, one row more than
    a page (that row says whether another page follows)."""
    if cursor:
        after = parse_page_cursor(cursor)
        when: datetime = from_ms(after.score)
        query = query.where(or_(at < when, and_(at == when, key < after.team_id)))
    return query.order_by(at.desc(), key.desc()).limit(limit + 1)


def _next_cursor(rows: Sequence[Any], limit: int, at: str, key: str) -> str | None:
    if len(rows) <= limit:
        return None
    last = rows[limit - 1]
    return page_cursor(to_ms(getattr(last, at)), getattr(last, key))


class Listings(UsesBackends):
    """Newest-first pages of activities and of an activity's formed or failed teams."""

    def __init__(self, backends: Backends, counts: ActivityCounts) -> None:
        super().__init__(backends)
        self._counts = counts

    async def activities(
        self, status: str | None, limit: int, cursor: str | None = None
    ) -> dict[str, Any]:
        """A page of activities (of one status, or all), newest first, and the next cursor."""
        query = select(ActivityRow)
        if status == "closed":
            query = query.where(ActivityRow.status == status)
        elif status is not None:
            query = await self._of_sale_status(query, status)
        query = _newest_first(query, ActivityRow.created_at, ActivityRow.activity_id, cursor, limit)
        async with self._db.sessions() as session:
            rows = (await session.scalars(query)).all()
        # One counts script per listed activity, sent together (a page is at most `limit`).
        counts = await self._counts.read_many([row.activity_id for row in rows[:limit]])
        return {
            "activities": [
                activity_body(row, c) for row, c in zip(rows[:limit], counts, strict=True)
            ],
            "next_cursor": _next_cursor(rows, limit, "created_at", "activity_id"),
        }

    async def _of_sale_status(self, query: Select[Any], status: str) -> Select[Any]:
        """`query` narrowed to the activities not closed whose sale is `status` (scheduled,
        open or ended) on Redis's clock now, as their bodies judge it."""
        now = from_ms(await self._clock.now_ms(self._redis))
        starts, ends = ActivityRulesRow.starts_at, ActivityRulesRow.ends_at
        not_ended = or_(ends.is_(None), ends > now)
        sale = {
            "ended": ends <= now,
            "scheduled": and_(starts > now, not_ended),
            "open": and_(or_(starts.is_(None), starts <= now), not_ended),
        }[status]
        return (
            query.outerjoin(
                ActivityRulesRow, ActivityRulesRow.activity_id == ActivityRow.activity_id
            )
            .where(ActivityRow.status == "open")
            .where(sale)
        )

    async def ended_teams(
        self, activity_id: str, status: EndedStatus, limit: int, cursor: str | None = None
    ) -> TeamsPage:
        """A page of the activity's formed (or failed) teams as SQL recorded them, newest end
        first; ActivityNotFound when SQL does not know the activity. Three statements
        whatever the page's size: the activity, the teams, and their members."""
        at = TeamRow.formed_at if status == "formed" else TeamRow.failed_at
        query = select(TeamRow).where(TeamRow.activity_id == activity_id, TeamRow.status == status)
        query = _newest_first(query, at, TeamRow.team_id, cursor, limit)
        async with self._db.sessions() as session:
            # Whether it exists only: not its row, whose rules load in a statement more.
            known = select(ActivityRow.activity_id).where(ActivityRow.activity_id == activity_id)
            if await session.scalar(known) is None:
                raise errors.ActivityNotFound(f"no activity {activity_id!r}")
            rows = (await session.scalars(query)).all()
            shown = rows[:limit]
            members = await members_of_teams(session, activity_id, [t.team_id for t in shown])
        return {
            "teams": [TeamView.from_rows(t, members.get(t.team_id, [])).body() for t in shown],
            "next_cursor": _next_cursor(rows, limit, f"{status}_at", "team_id"),
        }
