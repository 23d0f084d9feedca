"""TeamService: activities, teams, seat locks and membership (no HTTP in here).

Redis holds the live state and decides every change in one Lua script; SQL holds
the record. Activities are written to SQL first (they are rare, admin-made, and
the source of truth); team changes reach SQL through the activity's outbox stream,
which the deciding script writes in the same atomic call. Lock and unlock never
wait on SQL.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, NoReturn

import redis.exceptions
from sqlalchemy import delete, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.locks.codec import member_value, page_cursor, parse_page_cursor
from groupbuy.locks.codes import TeamCode, raise_for
from groupbuy.locks.models import ActivityRow, ActivityRulesRow, MemberRow, TeamRow
from groupbuy.locks.records import recorded_version
from groupbuy.locks.scripts import TeamReply, TeamScripts
from groupbuy.locks.view import TeamView
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.metrics import LOCK_OUTCOMES, RESTORED, counts_outcomes, lock_outcome
from groupbuy.outcome import Outcome
from groupbuy.settings import TeamSettings
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.calls import write_probe
from groupbuy.storage.db import insert_ignore
from groupbuy.storage.restore import rebuilding
from groupbuy.storage.scripts import optional_int, reply_dict
from groupbuy.storage.slots import due_in
from groupbuy.storage.timefmt import from_ms, iso_ms, to_ms

log = logging.getLogger(__name__)

# A user switching teams needs a second call naming the old team; more tries than
# this means the same user is racing with themselves, and they may simply retry.
_SWITCH_ATTEMPTS = 5
# How long Redis keeps its copy of an activity after it was last put there. The repair
# job drops it sooner once the activity's last live team has ended.
_ACTIVITY_COPY_TTL_MS = 86_400_000
# The repair job's re-index page: activities per run.
REINDEX_PAGE = 2000
# Script calls in flight at once (coalesced when auto_pipeline is on).
_CALLS_AT_ONCE = 32


class TeamService(UsesBackends):
    """The group-buy engine."""

    def __init__(
        self, backends: Backends, defaults: TeamSettings, outbox: TeamRecordWriter
    ) -> None:
        super().__init__(backends)
        self._defaults = defaults
        self._outbox = outbox
        self._teams = TeamScripts(backends.scripts, backends.keys, backends.clock)
        self._reindex_after = ""  # where the repair job's next re-index page starts
        self._restore_after: tuple[str, str] = ("", "")  # and its next page of open teams

    # -- activities ---------------------------------------------------------------

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
    ) -> Outcome:
        """Create an activity; the same id and parameters again returns the original."""
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
        # Over maxmemory Redis would refuse the activity's copy after the SQL row: ask first.
        await write_probe(self._scripts, self._keys.activity(activity_id))
        now_ms = await self._clock.now_ms(self._redis)
        async with self._db.transaction() as session:
            created = await insert_ignore(
                session, ActivityRow.__table__, {**wanted, "created_at": from_ms(now_ms)}
            )
            rules = (virtual_min_members, teams_per_user, open_teams_per_leader)
            if created and any(rule is not None for rule in rules):
                session.add(
                    ActivityRulesRow(
                        activity_id=activity_id,
                        virtual_min_members=virtual_min_members,
                        teams_per_user=teams_per_user,
                        open_teams_per_leader=open_teams_per_leader,
                    )
                )
                await session.flush()
            row = await session.get(ActivityRow, activity_id, populate_existing=True)
        assert row is not None
        body = self._activity_body(row)
        wanted["virtual_completion"] = _virtual_body(virtual_min_members)
        wanted["limits"] = _limits_body(teams_per_user, open_teams_per_leader)
        if not created and any(body[k] != v for k, v in wanted.items()):
            raise errors.Conflict(
                f"activity {activity_id!r} exists with other parameters", activity=body
            )
        try:
            await self._put_activity(row)
        except redis.exceptions.OutOfMemoryError:
            # Memory ran out after the probe: the client is told nothing was applied.
            if created:
                async with self._db.transaction() as session:
                    await session.execute(
                        delete(ActivityRulesRow).where(ActivityRulesRow.activity_id == activity_id)
                    )
                    await session.execute(
                        delete(ActivityRow).where(ActivityRow.activity_id == activity_id)
                    )
            raise
        return Outcome(body, created)

    async def get_activity(self, activity_id: str) -> dict[str, Any]:
        """An activity, or ActivityNotFound."""
        return self._activity_body(await self._activity_row(activity_id))

    async def _activity_row(self, activity_id: str) -> ActivityRow:
        async with self._db.sessions() as session:
            row = await session.get(ActivityRow, activity_id)
        if row is None:
            raise errors.ActivityNotFound(f"no activity {activity_id!r}")
        return row

    async def _put_activity(self, row: ActivityRow) -> None:
        # What team_open needs of an activity, in Redis; rewriting it is harmless. It is a
        # copy of SQL's row that expires: an open that misses it puts it back from SQL.
        # Its slot is in the directory first (Redis Cluster), with its copy of the blocked
        # users, before any team of it can be written there.
        await self._slots.join(self._keys.activity_slot(row.activity_id))
        key = self._keys.activity(row.activity_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(
                key,
                mapping={
                    "team_size": row.team_size,
                    "lock_ttl_ms": row.lock_ttl_s * 1000,
                    "team_deadline_ms": row.team_deadline_s * 1000,
                    "virtual_min": row.virtual_min_members or 0,
                    "teams_per_user": row.teams_per_user or 0,
                    "open_per_leader": row.open_teams_per_leader or 0,
                },
            )
            pipe.pexpire(key, _ACTIVITY_COPY_TTL_MS)
            await pipe.execute()

    @staticmethod
    def _activity_body(row: ActivityRow) -> dict[str, Any]:
        return {
            "activity_id": row.activity_id,
            "name": row.name,
            "team_size": row.team_size,
            "lock_ttl_s": row.lock_ttl_s,
            "team_deadline_s": row.team_deadline_s,
            "virtual_completion": _virtual_body(row.virtual_min_members),
            "limits": _limits_body(row.teams_per_user, row.open_teams_per_leader),
            "created_at": iso_ms(to_ms(row.created_at)),
        }

    # -- teams --------------------------------------------------------------------

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
        code, rest = opened.code, opened.rest
        if code is TeamCode.ACTIVITY_NOT_FOUND:
            # Redis may have lost the activity (restart without persistence): SQL knows it,
            # and this team too if it was opened before (a repeat must find it, not a new one).
            await self._put_activity(await self._activity_row(activity_id))
            await self._bring_back(activity_id, team_id)
            opened = await self._teams.open(
                activity_id, team_id, leader_id, order_id or "", retention_ms
            )
            code, rest = opened.code, opened.rest
        if code is TeamCode.CONFLICT:
            raise_for(code, f"team {team_id!r} exists with another leader or order")
        _refuse_for_user(code, leader_id, rest)
        if code not in (TeamCode.OK, TeamCode.EXISTING):
            raise_for(code)
        await self._outbox.drain_quietly(activity_id)
        return Outcome(_team_body(activity_id, team_id, rest), code is TeamCode.OK)

    async def get_team(self, activity_id: str, team_id: str) -> dict[str, Any]:
        """A team's current state: live from Redis, or from SQL once Redis let it go."""
        reply = await self._teams.read(activity_id, team_id)
        code, rest = reply.code, reply.rest
        if code is TeamCode.TEAM_NOT_FOUND and await self._bring_back(activity_id, team_id):
            return await self.get_team(activity_id, team_id)
        if code is TeamCode.OK:
            _now, *team = rest
            return _team_body(activity_id, team_id, team)
        return await self._recorded_team(activity_id, team_id)

    async def _recorded_team(self, activity_id: str, team_id: str) -> dict[str, Any]:
        async with self._db.sessions() as session:
            team = await session.get(TeamRow, (activity_id, team_id))
            if team is None:
                await self._raise_team_not_found(activity_id, team_id)
            members = await _recorded_members(session, activity_id, team_id)
            version = await recorded_version(session, activity_id, team_id)
        assert team is not None
        return TeamView.from_rows(team, members, version).body()

    async def _raise_team_not_found(self, activity_id: str, team_id: str) -> None:
        if not await self._redis.exists(self._keys.activity(activity_id)):
            await self._activity_row(activity_id)  # raises ActivityNotFound when unknown
        raise errors.TeamNotFound(f"no team {team_id!r} in activity {activity_id!r}")

    async def _confirmed_before(
        self, activity_id: str, team_id: str, user_id: str, order_id: str
    ) -> Outcome:
        """A confirm of a team Redis no longer holds (ended and released): the same answer as
        before when SQL records this user with this order (a retry after a 503, say), else
        the refusal its SQL record gives."""
        team = await self._recorded_team(activity_id, team_id)
        members = team["members"]
        if not any(m["user_id"] == user_id and m["order_id"] == order_id for m in members):
            await self._raise_for_missing_team(activity_id, team_id)
        # The confirm that completed the team is the last member of a team formed in full.
        completed = team["status"] == "formed" and not team["virtual_seats"]
        formed = completed and members[-1]["user_id"] == user_id
        return Outcome({"team": team, "formed": formed}, False)

    async def _raise_for_missing_team(self, activity_id: str, team_id: str) -> None:
        # Redis no longer holds the team: its SQL record tells how it ended.
        team = await self._recorded_team(activity_id, team_id)
        if team["status"] == "formed":
            raise errors.TeamFormed()
        if team["status"] == "failed":
            raise errors.TeamFailed()
        raise errors.TeamNotFound(f"team {team_id!r} is no longer in Redis")

    # -- when Redis has lost a team -------------------------------------------------

    async def _bring_back(self, activity_id: str, team_id: str) -> bool:
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
        lived only in Redis): the shoppers who held one lock again. A team past its deadline
        fails on its next call, as it would have.
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
                members = await _recorded_members(session, activity_id, team_id)
                # The rebuild is a change of its own: after every change SQL has seen.
                version = await recorded_version(session, activity_id, team_id) + 1
            await self._put_activity(activity)
            recorded: list[Any] = []
            leader_order = ""
            for m in members:
                recorded += [m.user_id, member_value(m.seq, to_ms(m.joined_at), m.order_id)]
                if m.user_id == team.leader_id:
                    leader_order = m.order_id or ""
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
            )
        if reply.code is not TeamCode.OK:
            return False
        RESTORED.labels("team").inc()
        log.warning(
            "team %s of activity %s was missing from Redis: rebuilt from SQL with its %d "
            "recorded members (its seat locks are gone)",
            team_id,
            activity_id,
            len(members),
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

    # -- seat locks ---------------------------------------------------------------

    @counts_outcomes(LOCK_OUTCOMES, lock_outcome, "lock")
    async def lock(self, activity_id: str, team_id: str, user_id: str) -> Outcome:
        """Hold a free seat of the team for the user (releasing their lock in another team)."""
        other = ""
        restored = False
        for _ in range(_SWITCH_ATTEMPTS):
            reply = await self._teams.lock(activity_id, team_id, user_id, other)
            code, rest = reply.code, reply.rest
            if code is TeamCode.SWITCH_NEEDED:
                other = rest[0]
                continue
            if code is TeamCode.TEAM_NOT_FOUND and not restored:
                restored = True
                if await self._bring_back(activity_id, team_id):
                    continue
            break
        else:
            raise errors.Conflict("the user's lock changed during every attempt; retry")

        if code is TeamCode.OK:
            locked_at, expires_at, released, version = rest
            return _lock_outcome(user_id, team_id, locked_at, expires_at, version, released)
        if code is TeamCode.EXISTING:
            locked_at, expires_at, version = rest
            return _lock_outcome(user_id, team_id, locked_at, expires_at, version)
        if code is TeamCode.TEAM_FULL:
            earliest, next_unlock = (optional_int(v) for v in rest)
            raise_for(
                code,
                f"team {team_id!r} has no free seat",
                next_unlock_at=iso_ms(next_unlock),
                earliest_locked_at=iso_ms(earliest),
            )
        if code is TeamCode.TEAM_NOT_FOUND:
            await self._raise_for_missing_team(activity_id, team_id)
        _refuse_for_user(code, user_id, rest)
        raise_for(code)

    # -- teams picked from the activity's open-seat index ------------------------------

    @counts_outcomes(LOCK_OUTCOMES, lock_outcome, "join")
    async def join(self, activity_id: str, user_id: str) -> Outcome:
        """Hold a free seat for the user in the open team of the activity closest to forming
        (most members + live locks, then the oldest); the user's live lock in the activity,
        wherever it is, is the answer instead (`existing`)."""
        cursor: list[Any] = ["", ""]
        while True:
            # Each call looks at a bounded number of teams; a long way down the index (the
            # user belongs to many of the first teams) takes several calls.
            code, rest = await self._pick(
                activity_id,
                partial(self._teams.join, activity_id, user_id, self._defaults.join_candidates),
                cursor,
            )
            if code is not TeamCode.LOOK_FURTHER:
                break
            cursor = rest
        if code in (TeamCode.OK, TeamCode.EXISTING):
            team_id, locked_at, expires_at, version = rest
            # Joining never releases a lock: a live one anywhere is the answer (EXISTING).
            released = "" if code is TeamCode.OK else None
            return _lock_outcome(user_id, team_id, locked_at, expires_at, version, released)
        if code is TeamCode.NO_TEAM_AVAILABLE:
            raise_for(
                code,
                f"no open team of activity {activity_id!r} has a free seat for {user_id!r}",
                next_unlock_at=iso_ms(optional_int(rest[0])),
            )
        _refuse_for_user(code, user_id, rest)
        raise_for(code)

    async def list_open_teams(
        self, activity_id: str, limit: int, cursor: str | None = None
    ) -> dict[str, Any]:
        """A page of the activity's open teams with a free seat, closest to forming first, and
        the cursor of the next page (None after the last one)."""
        after = parse_page_cursor(cursor) if cursor else None
        position = [after.score, after.team_id] if after else ["", ""]
        listing = partial(self._teams.list, activity_id, limit, self._defaults.join_candidates)
        code, rest = await self._pick(activity_id, listing, position)
        if code is not TeamCode.OK:
            raise_for(code)
        score, team_id, page = rest
        return {
            "teams": [_team_body(activity_id, listed, snapshot) for listed, *snapshot in page],
            "next_cursor": page_cursor(int(score), team_id) if team_id else None,
        }

    async def _pick(
        self,
        activity_id: str,
        script: Callable[[Sequence[Any]], Awaitable[TeamReply]],
        cursor: Sequence[Any],
    ) -> tuple[TeamCode, list[Any]]:
        """Call a script that picks among the activity's teams (lua/_team_pick.lua) from
        `cursor`; when Redis has no copy of the activity, put it back from SQL (404 when
        unknown) and again."""
        reply = await script(cursor)
        if reply.code is TeamCode.ACTIVITY_NOT_FOUND:
            await self._put_activity(await self._activity_row(activity_id))
            reply = await script(cursor)
        return reply.code, reply.rest

    async def unlock(self, activity_id: str, team_id: str, user_id: str) -> bool:
        """Release the user's lock on the team; False when there was none."""
        reply = await self._teams.unlock(activity_id, team_id, user_id)
        code, rest = reply.code, reply.rest
        if code is TeamCode.TEAM_NOT_FOUND:
            await self._recorded_team(activity_id, team_id)  # raises when unknown
            return False
        if code is not TeamCode.OK:
            raise_for(code)
        return bool(int(rest[0]))

    async def confirm(self, activity_id: str, team_id: str, user_id: str, order_id: str) -> Outcome:
        """Payment succeeded: the user's lock becomes membership; a repeat returns the same."""
        reply = await self._teams.confirm(activity_id, team_id, user_id, order_id)
        if reply.code is TeamCode.TEAM_NOT_FOUND and await self._bring_back(activity_id, team_id):
            reply = await self._teams.confirm(activity_id, team_id, user_id, order_id)
        code, rest = reply.code, reply.rest
        if code is TeamCode.TEAM_NOT_FOUND:
            return await self._confirmed_before(activity_id, team_id, user_id, order_id)
        _refuse_for_user(code, user_id, rest)
        if code not in (TeamCode.OK, TeamCode.EXISTING):
            raise_for(code)
        # The answer waits for the membership's record in SQL. The script has made the user
        # a member in Redis (no lock left to expire) and written the record to the outbox in
        # the same call: SQL away, this raises (503 database_unavailable), the record waits
        # in Redis, and the backend's retry answers EXISTING once a flush has it in SQL.
        await self._outbox.drain(activity_id)
        # `formed` is this confirm's own: true for exactly one confirm per team (and its
        # repeats), so a backend can say "your team is complete" once.
        formed_by_this, *snapshot = rest
        team = _team_body(activity_id, team_id, snapshot)
        return Outcome({"team": team, "formed": bool(int(formed_by_this))}, code is TeamCode.OK)

    async def current_lock(self, activity_id: str, user_id: str) -> dict[str, Any]:
        """The user's unexpired lock in the activity, or NoLock (one script call)."""
        reply = await self._teams.user_lock(activity_id, user_id)
        code, rest = reply.code, reply.rest
        if code is TeamCode.NO_LOCK:
            await self._activity_row(activity_id)  # an unknown activity is a 404 of its own
            raise errors.NoLock(f"user {user_id!r} holds no lock in activity {activity_id!r}")
        if code is not TeamCode.OK:
            raise_for(code)
        team_id, locked_at, expires_at = rest
        return {
            "team_id": team_id,
            "locked_at": iso_ms(int(locked_at)),
            "expires_at": iso_ms(int(expires_at)),
        }

    # -- what time does (the scheduled jobs) ------------------------------------------

    async def expire_locks(self, batch: int) -> dict[str, int]:
        """Remove every expired seat lock (one lock.expired record each); safe to repeat."""
        return await self._sweep("lock_due", batch)

    async def expire_due(self, batch: int) -> dict[str, int]:
        """Fail every open team past its deadline (one team.failed record each); safe to repeat."""
        return await self._sweep("deadlines", batch)

    async def _sweep(self, index: str, batch: int, max_batches: int = 50) -> dict[str, int]:
        """Apply expiry to the teams an index says are due: `lock_due` (expired locks) or
        `deadlines` (teams past their deadline fail). The due index (one per slot in use in
        Redis Cluster) names the activities that may have a due team; each one's own index
        names the teams. One short script per team, read in bounded batches, so no script
        runs long; safe to run anywhere, any number of times."""
        team_index, due_index_in = {
            "lock_due": (self._keys.lock_index, self._keys.due_locks),
            "deadlines": (self._keys.deadline_index, self._keys.due_deadlines),
        }[index]
        now_ms = await self._clock.now_ms(self._redis)
        report = {
            "activities": 0,
            "teams": 0,
            "locks_expired": 0,
            "teams_failed": 0,
            "teams_formed_virtually": 0,
        }
        seen: set[str] = set()
        # Each slot's due index is read in batches until it lists nothing new; the slots
        # still being read are read together, one pipeline per round.
        slots = await self._slots.in_use()
        for _ in range(max_batches):
            due_indexes = [due_index_in(slot) for slot in slots]
            listed = await due_in(self._redis, due_indexes, now_ms, batch)
            more: list[int | None] = []
            for slot, due_index, due in zip(slots, due_indexes, listed, strict=True):
                fresh = [activity_id for activity_id in due if activity_id not in seen]
                for activity_id in fresh:
                    seen.add(activity_id)
                    report["activities"] += 1
                    touched = await self._sweep_activity(
                        activity_id,
                        team_index(activity_id),
                        index,
                        now_ms,
                        batch,
                        max_batches,
                        report,
                    )
                    # Its entry becomes its earliest due team again (or goes): after the
                    # sweep, so a team indexed meanwhile is never hidden behind a later score.
                    await self._teams.reindex(activity_id, team_index(activity_id), due_index)
                    if touched:
                        await self._outbox.drain_quietly(activity_id)
                if len(due) == batch and fresh:
                    more.append(slot)
            if not more:
                break
            slots = more
        return report

    async def _sweep_activity(
        self,
        activity_id: str,
        team_index: str,
        index: str,
        now_ms: int,
        batch: int,
        max_batches: int,
        report: dict[str, int],
    ) -> bool:
        touched = False
        for _ in range(max_batches):
            due = await self._redis.zrangebyscore(team_index, "-inf", now_ms, start=0, num=batch)
            for team_id in due:
                swept = await self._teams.sweep(activity_id, team_id)
                code, rest = swept.code, swept.rest
                report["teams"] += 1
                if code is TeamCode.OK:
                    report["locks_expired"] += int(rest[0])
                    ended = rest[1] if int(rest[2]) else ""  # this call ended it
                    report["teams_failed"] += ended == "failed"
                    report["teams_formed_virtually"] += ended == "formed"
            touched = touched or bool(due)
            if len(due) < batch:
                break
        return touched

    async def release_ended(self, limit: int = 1000) -> dict[str, int]:
        """Remove from Redis what SQL has fully recorded: ended teams, then the copy of each
        of their activities that has no live team left."""
        async with self._db.sessions() as session:
            ended = (
                await session.execute(
                    select(TeamRow.activity_id, TeamRow.team_id)
                    .where(
                        TeamRow.status.in_(("formed", "failed")), TeamRow.redis_cleared.is_(False)
                    )
                    .limit(limit)
                )
            ).all()
        for activity_id, team_id in ended:
            team = self._keys.team_keys(activity_id, team_id)
            await self._redis.delete(team.hash, team.members, team.locks)
            activity = self._keys.activity_keys(activity_id)
            for index in (activity.lock_index, activity.deadlines, activity.open_seats):
                await self._redis.zrem(index, team_id)
        if ended:
            async with self._db.transaction() as session:
                for activity_id, team_id in ended:
                    await session.execute(
                        update(TeamRow)
                        .where(TeamRow.activity_id == activity_id, TeamRow.team_id == team_id)
                        .values(redis_cleared=True)
                    )
        # Only an activity whose team has just ended can have become idle; any other copy
        # expires by itself (_ACTIVITY_COPY_TTL_MS).
        released = 0
        for activity_id in sorted({activity_id for activity_id, _team in ended}):
            released += await self._teams.release(activity_id)
        return {"teams_released": len(ended), "activities_released": released}

    async def reindex(self, page: int = REINDEX_PAGE, restore_limit: int = 500) -> dict[str, int]:
        """Put back lost index entries for the next page of SQL's activities: the repair
        job's slow safety net (a full pass takes activities / page runs). An outbox stream
        with records waiting goes back in the pending index, an activity with locks or open
        teams back in the due indexes at its earliest; then the next page of SQL's open teams
        is checked against Redis and those it lost are rebuilt (`restore_missing`)."""
        async with self._db.sessions() as session:
            ids = list(
                (
                    await session.scalars(
                        select(ActivityRow.activity_id)
                        .where(ActivityRow.activity_id > self._reindex_after)
                        .order_by(ActivityRow.activity_id)
                        .limit(page)
                    )
                ).all()
            )
        keys = self._keys
        # A slot the directory lost (Redis lost data) is listed again, so the jobs read it.
        await self._slots.join(*(keys.activity_slot(activity_id) for activity_id in ids))
        calls: list[Callable[[], Awaitable[Any]]] = []
        for activity_id in ids:
            calls.append(partial(self._outbox.ack, activity_id, []))
            slot = keys.activity_slot(activity_id)
            for team_index, due_index in (
                (keys.lock_index(activity_id), keys.due_locks(slot)),
                (keys.deadline_index(activity_id), keys.due_deadlines(slot)),
            ):
                calls.append(partial(self._teams.reindex, activity_id, team_index, due_index))
        for start in range(0, len(calls), _CALLS_AT_ONCE):
            await asyncio.gather(*(call() for call in calls[start : start + _CALLS_AT_ONCE]))
        self._reindex_after = ids[-1] if len(ids) == page else ""
        restored = await self.restore_missing(page, restore_limit)
        return {"activities_reindexed": len(ids), "teams_restored": restored}


async def _recorded_members(
    session: AsyncSession, activity_id: str, team_id: str
) -> Sequence[MemberRow]:
    """A team's member rows in joining order."""
    query = (
        select(MemberRow)
        .where(MemberRow.activity_id == activity_id, MemberRow.team_id == team_id)
        .order_by(MemberRow.seq)
    )
    return (await session.scalars(query)).all()


def _refuse_over_limit(user_id: str, rest: list[Any]) -> NoReturn:
    """409 user_limit_reached from a script's {limit, current, limit name}."""
    limit, current, name = int(rest[0]), int(rest[1]), str(rest[2])
    raise_for(
        TeamCode.USER_LIMIT_REACHED,
        f"user {user_id!r} is at the activity's {name} limit ({current} of {limit})",
        limit=limit,
        current=current,
        limit_name=name,
    )


def _refuse_for_user(code: TeamCode, user_id: str, rest: list[Any]) -> None:
    """Raise for the refusals that concern the user rather than the team (one of the
    activity's limits reached, a blocked user); return for any other code."""
    if code is TeamCode.USER_LIMIT_REACHED:
        _refuse_over_limit(user_id, rest)
    if code is TeamCode.USER_BLOCKED:
        _refuse_blocked(user_id)


def _refuse_blocked(user_id: str) -> NoReturn:
    """403 user_blocked: an admin blocked the user (the script found them in the blocklist)."""
    raise_for(TeamCode.USER_BLOCKED, f"user {user_id!r} is blocked", user_id=user_id)


def _virtual_body(min_members: int | None) -> dict[str, int] | None:
    """An activity's `virtual_completion` as the API shows it."""
    return None if min_members is None else {"min_members": min_members}


def _limits_body(teams_per_user: int | None, open_per_leader: int | None) -> dict[str, Any] | None:
    """An activity's `limits` as the API shows it (null when it sets none)."""
    if teams_per_user is None and open_per_leader is None:
        return None
    return {"teams_per_user": teams_per_user, "open_teams_per_leader": open_per_leader}


def _lock_outcome(
    user_id: str,
    team_id: str,
    locked_at: Any,
    expires_at: Any,
    version: Any,
    released: str | None = None,
) -> Outcome:
    """The answer of a lock from a script's reply: a new lock when `released` is given ('' for
    none), else the user's existing lock, unchanged."""
    body = {
        "status": "locked",
        "user_id": user_id,
        "team_id": team_id,
        "locked_at": iso_ms(int(locked_at)),
        "expires_at": iso_ms(int(expires_at)),
        "released_team_id": released or None,
        "version": int(version),
    }
    if released is None:
        return Outcome({**body, "existing": True}, False)
    return Outcome(body, True)


def _team_body(activity_id: str, team_id: str, snapshot: list[Any]) -> dict[str, Any]:
    """The API body of a team from the three lists a team script answers it with (the team
    hash, the members hash, the locks oldest first; see `snapshot` in lua/_team_lib.lua)."""
    team, members, locks = snapshot
    return TeamView.from_redis(
        activity_id, team_id, reply_dict(team), reply_dict(members), locks
    ).body()
