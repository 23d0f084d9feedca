"""A team's SQL record: the answers once Redis let the team go (ended and released), and
the hook the operations call when Redis lost a team it should hold (`MissingTeam`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn, Protocol

from groupbuy_client.wire import Dissolved, MemberLeft, Outcome, Team
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.locks.activity_copy import ActivityCopy
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.locks.view import TeamView
from groupbuy.storage.backends import Backends, UsesBackends


class MissingTeam(Protocol):
    """What the hot path does when Redis does not hold a team or activity (TeamRecovery)."""

    async def bring_back(self, activity_id: str, team_id: str) -> bool:
        """Rebuild the team in Redis from SQL; False when SQL has no open team to rebuild."""

    async def bring_back_activity(self, activity_id: str) -> None:
        """Put the activity's copy back in Redis from SQL (ActivityNotFound when unknown)."""


class TeamHistory(UsesBackends):
    """Answers about a team from its SQL record, for the calls Redis can no longer answer."""

    def __init__(self, backends: Backends, activities: ActivityCopy) -> None:
        super().__init__(backends)
        self._activities = activities

    async def team(self, activity_id: str, team_id: str) -> Team:
        """The team's API body from SQL, or TeamNotFound (ActivityNotFound when the activity
        is unknown too)."""
        async with self._db.sessions() as session:
            team = await session.get(TeamRow, (activity_id, team_id))
            if team is None:
                await self._raise_team_not_found(activity_id, team_id)
            members = await recorded_members(session, activity_id, team_id)
        assert team is not None
        return TeamView.from_rows(team, members).body()

    async def _raise_team_not_found(self, activity_id: str, team_id: str) -> None:
        if not await self._redis.exists(self._keys.activity(activity_id)):
            await self._activities.row(activity_id)  # raises ActivityNotFound when unknown
        raise errors.TeamNotFound(f"no team {team_id!r} in activity {activity_id!r}")

    async def confirmed_before(
        self, activity_id: str, team_id: str, user_id: str, order_id: str
    ) -> Outcome:
        """A confirm of a team Redis no longer holds (ended and released): the same answer as
        before when SQL records this user with this order (a retry after a 503, say), else
        the refusal its SQL record gives."""
        team = await self.team(activity_id, team_id)
        members = team["members"]
        if not any(m["user_id"] == user_id and m["order_id"] == order_id for m in members):
            await self.raise_for_missing_team(activity_id, team_id)
        # The confirm that completed the team is the last member of a team formed in full.
        completed = team["status"] == "formed" and not team["virtual_seats"]
        formed = completed and members[-1]["user_id"] == user_id
        return Outcome({"team": team, "formed": formed}, False)

    async def left_before(
        self, activity_id: str, team_id: str, user_id: str, order_id: str | None
    ) -> MemberLeft:
        """A leave from a team Redis no longer holds (ended and released): the same answer as
        before when SQL records this user's leave with this order (a retry after a 503, say),
        else the refusal its SQL record gives."""
        team = await self.team(activity_id, team_id)  # raises when unknown
        async with self._db.sessions() as session:
            row = await session.get(MemberRow, (activity_id, team_id, user_id))
        if row is None:
            raise errors.NotAMember(f"user {user_id!r} is not a member of team {team_id!r}")
        if row.order_id != (order_id or None):
            raise errors.OrderMismatch(f"user {user_id!r} joined with another order")
        if row.left_at is not None:
            return {"team": team, "left": True}
        if row.refunded_at is not None:
            return {"team": team, "refunded": True}
        await self.raise_for_missing_team(activity_id, team_id)

    async def dissolved_before(self, activity_id: str, team_id: str) -> Dissolved:
        """A dissolve of a team Redis no longer holds: the same answer when SQL records it
        failed by a dissolve, else the refusal its SQL record gives."""
        async with self._db.sessions() as session:
            row = await session.get(TeamRow, (activity_id, team_id))
        if row is not None and row.failed_reason == "dissolved":
            return {"team": await self.team(activity_id, team_id), "dissolved": True}
        await self.raise_for_missing_team(activity_id, team_id)

    async def raise_for_missing_team(self, activity_id: str, team_id: str) -> NoReturn:
        """Raise the refusal the SQL record of a team Redis no longer holds gives: formed,
        failed, or not found."""
        team = await self.team(activity_id, team_id)
        if team["status"] == "formed":
            raise errors.TeamFormed()
        if team["status"] == "failed":
            raise errors.TeamFailed()
        raise errors.TeamNotFound(f"team {team_id!r} is no longer in Redis")


async def recorded_members(
    session: AsyncSession, activity_id: str, team_id: str
) -> Sequence[MemberRow]:
    """A team's member rows in joining order."""
    query = (
        select(MemberRow)
        .where(MemberRow.activity_id == activity_id, MemberRow.team_id == team_id)
        .order_by(MemberRow.seq)
    )
    return (await session.scalars(query)).all()


async def members_of_teams(
    session: AsyncSession, activity_id: str, team_ids: Sequence[str]
) -> dict[str, list[MemberRow]]:
    """The member rows of several teams of an activity (a page's), each team's in joining
    order: one statement on the primary key's prefix, whatever their number."""
    members: dict[str, list[MemberRow]] = {}
    if not team_ids:
        return members
    query = (
        select(MemberRow)
        .where(MemberRow.activity_id == activity_id, MemberRow.team_id.in_(team_ids))
        .order_by(MemberRow.team_id, MemberRow.seq)
    )
    for member in await session.scalars(query):
        members.setdefault(member.team_id, []).append(member)
    return members
