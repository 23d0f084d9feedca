"""Activities and teams as the admin and the shop see them: create and read an activity,
open a team, read one, list the open ones (no HTTP in here).

Activities are written to SQL first (they are rare, admin-made, and the source of truth),
then copied into Redis for the scripts. A team opens in one script, which writes its
record to the activity's outbox stream in the same atomic call.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime
from typing import Any

import redis.exceptions
from groupbuy_client.wire import Outcome, Team, TeamsPage, from_ms, to_ms
from sqlalchemy import delete

from groupbuy import errors
from groupbuy.locks.activity_copy import ActivityCopy
from groupbuy.locks.bodies import activity_body, limits_body, virtual_body
from groupbuy.locks.codec import page_cursor, parse_page_cursor
from groupbuy.locks.codes import TeamCode, raise_for
from groupbuy.locks.history import TeamHistory
from groupbuy.locks.models import ActivityRow, ActivityRulesRow
from groupbuy.locks.recovery import TeamRecovery
from groupbuy.locks.refusals import refuse_for_user
from groupbuy.locks.sale import Sale, activity_sale, refuse_for_sale
from groupbuy.locks.scripts import TeamScripts
from groupbuy.locks.view import TeamView
from groupbuy.locks.waitlist import serve_line
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.settings import TeamSettings
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.calls import write_probe
from groupbuy.storage.db import insert_ignore

_log = logging.getLogger(__name__)


class ActivityService(UsesBackends):
    """Creates and reads activities; opens, reads and lists their teams."""

    def __init__(
        self,
        backends: Backends,
        defaults: TeamSettings,
        outbox: TeamRecordWriter,
        scripts: TeamScripts,
        activities: ActivityCopy,
        history: TeamHistory,
        recovery: TeamRecovery,
    ) -> None:
        super().__init__(backends)
        self._defaults = defaults
        self._outbox = outbox
        self._teams = scripts
        self._activities = activities
        self._history = history
        self._recovery = recovery

    async def create_activity(
        self,
        activity_id: str,
        name: str | None = None,
        team_size: int | None = None,
        lock_ttl_s: int | None = None,
        team_deadline_s: int | None = None,
        virtual_min_members: int | None = None,
        teams_per_user: int | None = None,
        open_teams_per_leader: int | None = None,
        sale: Sale | None = None,
    ) -> Outcome:
        """Create an activity; the same id and parameters again returns the original."""
        sale = sale or Sale()
        wanted: dict[str, Any] = {
            "activity_id": activity_id,
            "name": name,
            "team_size": team_size or self._defaults.team_size,
            "lock_ttl_s": lock_ttl_s or self._defaults.lock_ttl_s,
            "team_deadline_s": team_deadline_s or self._defaults.team_deadline_s,
        }
        if virtual_min_members is not None and virtual_min_members > wanted["team_size"]:
            raise errors.InvalidRequest(
                f"virtual_completion.min_members may be at most team_size ({wanted['team_size']})"
            )
        sale.check(wanted["lock_ttl_s"])
        # Over maxmemory Redis would refuse the activity's copy after the SQL row: ask first.
        await write_probe(self._scripts, self._keys.activity(activity_id))
        now_ms = await self._clock.now_ms(self._redis)
        async with self._db.transaction(urgent=True) as session:
            created = await insert_ignore(
                session, ActivityRow.__table__, {**wanted, "created_at": from_ms(now_ms)}
            )
            rules = (virtual_min_members, teams_per_user, open_teams_per_leader)
            if created and (any(rule is not None for rule in rules) or sale.sets_any):
                session.add(
                    ActivityRulesRow(
                        activity_id=activity_id,
                        virtual_min_members=virtual_min_members,
                        teams_per_user=teams_per_user,
                        open_teams_per_leader=open_teams_per_leader,
                        **sale.columns(),
                    )
                )
                await session.flush()
            row = await session.get(ActivityRow, activity_id, populate_existing=True)
        assert row is not None
        body = await self._body(row)
        wanted["virtual_completion"] = virtual_body(virtual_min_members)
        wanted["limits"] = limits_body(teams_per_user, open_teams_per_leader)
        wanted.update(sale.shown(wanted["lock_ttl_s"]))
        if not created and any(body.get(k) != v for k, v in wanted.items()):
            raise errors.Conflict(
                f"activity {activity_id!r} exists with other parameters", activity=body
            )
        try:
            await self._activities.put(row)
        except redis.exceptions.OutOfMemoryError:
            # Memory ran out after the probe: the client is told nothing was applied.
            if created:
                async with self._db.transaction(urgent=True) as session:
                    await session.execute(
                        delete(ActivityRulesRow).where(ActivityRulesRow.activity_id == activity_id)
                    )
                    await session.execute(
                        delete(ActivityRow).where(ActivityRow.activity_id == activity_id)
                    )
            raise
        return Outcome(body, created)

    async def update_activity(
        self,
        activity_id: str,
        name: str | None = None,
        close: bool = False,
        ends_at: datetime | None = None,
        stock: int | None = None,
    ) -> Outcome:
        """Rename, close, and/or change the end or the stock of an activity; `created` of
        the outcome is True when this call closed it. Closing is final and idempotent;
        ActivityNotFound when unknown; Conflict (`stock_held`) for a stock below the units
        held; InvalidRequest for an end not after the start."""
        if close:
            # Over maxmemory Redis would refuse the copy's status after SQL closed: ask first.
            await write_probe(self._scripts, self._keys.activity(activity_id))
        now_ms = await self._clock.now_ms(self._redis) if close else 0
        sale_before: tuple[datetime | None, int | None] | None = None
        try:
            async with self._db.transaction(urgent=True) as session:
                row = await session.get(ActivityRow, activity_id, with_for_update=True)
                if row is None:
                    raise errors.ActivityNotFound(f"no activity {activity_id!r}")
                if name is not None:
                    row.name = name
                closed_now = close and row.status != "closed"
                if closed_now:
                    row.status, row.closed_at = "closed", from_ms(now_ms)
                if ends_at is not None or stock is not None:
                    # Redis decides (the row locked: one change at a time), then SQL commits.
                    before = (row.ends_at, row.stock)
                    await self._change_sale(row, ends_at, stock)
                    sale_before = before  # Redis has the change from here on
                    rules = row.rules or ActivityRulesRow(activity_id=activity_id)
                    rules.ends_at = ends_at if ends_at is not None else rules.ends_at
                    rules.stock = stock if stock is not None else rules.stock
                    if row.rules is None:
                        session.add(rules)
                        row.rules = rules
                await session.flush()
        except BaseException:
            if sale_before is not None:
                # Redis took the change, SQL did not: Redis goes back to SQL's sale.
                try:
                    await self._put_back_sale(activity_id, *sale_before)
                except redis.exceptions.RedisError:
                    _log.warning(
                        "activity %s: its Redis copy keeps a sale SQL refused", activity_id
                    )
            raise
        # SQL first, then Redis: SQL is the status's source of truth. A crash (or Redis
        # refusing the write) in between leaves SQL closed and the copy open for a moment;
        # every close re-writes the copy, even of an activity SQL already has closed, so the
        # retried PATCH finishes it, and a copy put back from SQL after a loss or an expiry
        # carries the status. Never the other way round: Redis closed, SQL open.
        if row.status == "closed":
            await self._activities.put(row)
        elif stock is not None:
            await serve_line(self._teams, activity_id)  # units a raise gave: to the line
        return Outcome(await self._body(row), closed_now)

    async def _change_sale(
        self, row: ActivityRow, ends_at: datetime | None, stock: int | None
    ) -> None:
        """The new end and/or stock in the activity's Redis copy, the stock checked against
        the units held in the same script call."""
        starts_at = row.starts_at
        if ends_at is not None and starts_at is not None and to_ms(ends_at) <= to_ms(starts_at):
            raise errors.InvalidRequest("ends_at must be after starts_at")
        ends_ms = None if ends_at is None else to_ms(ends_at)
        reply = await activity_sale(self._teams, row.activity_id, stock, ends_ms)
        if reply.code is TeamCode.ACTIVITY_NOT_FOUND:
            await self._activities.put(row)  # SQL's sale as it is: the change comes next
            reply = await activity_sale(self._teams, row.activity_id, stock, ends_ms)
        if reply.code is TeamCode.CONFLICT:
            raise errors.Conflict(
                f"{reply.held} units are held: the stock may not be lower",
                stock_held=reply.held,
            )
        if reply.code is not TeamCode.OK:
            raise errors.Conflict("the activity's copy in Redis went away meanwhile; retry")

    async def _put_back_sale(
        self, activity_id: str, ends_at: datetime | None, stock: int | None
    ) -> None:
        """The sale of the activity's Redis copy set back to SQL's (a change SQL refused)."""
        key = self._keys.activity(activity_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            for field, value in (
                ("ends_ms", None if ends_at is None else to_ms(ends_at)),
                ("stock", stock),
            ):
                if value is None:
                    pipe.hdel(key, field)
                else:
                    pipe.hset(key, field, value)
            await pipe.execute()

    async def get_activity(self, activity_id: str) -> dict[str, Any]:
        """An activity with its live counts, or ActivityNotFound."""
        return await self._body(await self._activities.row(activity_id))

    async def _body(self, row: ActivityRow) -> dict[str, Any]:
        return activity_body(row, await self._activities.counts.read(row.activity_id))

    async def open_team(
        self,
        activity_id: str,
        leader_id: str,
        team_id: str | None = None,
        order_id: str | None = None,
    ) -> Outcome:
        """Open a team led by `leader_id` (member 1); a repeat with the same id returns it."""
        team_id = team_id or f"t{secrets.token_hex(8)}"
        retention_ms = self._defaults.retention_s * 1000
        opened = await self._teams.open(
            activity_id, team_id, leader_id, order_id or "", retention_ms
        )
        if opened.code is TeamCode.ACTIVITY_NOT_FOUND:
            # Redis may have lost the activity (restart without persistence): SQL knows it,
            # and this team too if it was opened before (a repeat must find it, not a new one).
            await self._recovery.bring_back_activity(activity_id)
            await self._recovery.bring_back(activity_id, team_id)
            opened = await self._teams.open(
                activity_id, team_id, leader_id, order_id or "", retention_ms
            )
        if opened.code is TeamCode.CONFLICT:
            raise_for(opened.code, f"team {team_id!r} exists with another leader or order")
        refuse_for_user(opened, leader_id)
        refuse_for_sale(opened)
        if opened.code not in (TeamCode.OK, TeamCode.EXISTING):
            raise_for(opened.code)
        await self._outbox.drain_quietly(activity_id)
        team = TeamView.from_snapshot(activity_id, team_id, opened.team)
        return Outcome(team.body(), opened.code is TeamCode.OK)

    async def get_team(self, activity_id: str, team_id: str) -> Team:
        """A team's current state: live from Redis, or from SQL once Redis let it go."""
        reply = await self._teams.read(activity_id, team_id)
        if reply.code is TeamCode.TEAM_NOT_FOUND and await self._recovery.bring_back(
            activity_id, team_id
        ):
            return await self.get_team(activity_id, team_id)
        if reply.code is TeamCode.OK:
            return TeamView.from_snapshot(activity_id, team_id, reply.team).body()
        return await self._history.team(activity_id, team_id)

    async def list_open_teams(
        self, activity_id: str, limit: int, cursor: str | None = None, full: bool = False
    ) -> TeamsPage:
        """A page of the activity's open teams with a free seat, closest to forming first (or,
        `full`, of those full of members and locks, earliest deadline first), and the cursor
        of the next page (None after the last one)."""
        after = parse_page_cursor(cursor) if cursor else None
        position = [after.score, after.team_id] if after else ["", ""]
        candidates = self._defaults.join_candidates
        page = await self._teams.list(activity_id, limit, candidates, position, full)
        if page.code is TeamCode.ACTIVITY_NOT_FOUND:
            await self._recovery.bring_back_activity(activity_id)
            page = await self._teams.list(activity_id, limit, candidates, position, full)
        if page.code is not TeamCode.OK:
            raise_for(page.code)
        teams = [TeamView.from_snapshot(activity_id, *listed) for listed in page.page]
        after = page.cursor_team_id  # '' after the last page
        return {
            "teams": [team.body() for team in teams],
            "next_cursor": page_cursor(int(page.cursor_score), after) if after else None,
        }
