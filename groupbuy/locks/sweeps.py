"""What time does to teams (the scheduled jobs), and the repair job's share of the engine.

Expiry is applied by the scripts lazily on every call; these sweeps apply it to the teams
nobody calls, so locks expire and deadlines pass on time. The repair job releases what
SQL has fully recorded and puts back what Redis lost (index entries, open teams).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from sqlalchemy import select, update

from groupbuy.locks.codes import TeamCode
from groupbuy.locks.models import ActivityRow, TeamRow
from groupbuy.locks.recovery import TeamRecovery
from groupbuy.locks.scripts import TeamScripts
from groupbuy.locks.waitlist import expire_entries
from groupbuy.locks.writer import TeamRecordWriter
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.slots import due_in

# The repair job's re-index page: activities per run.
REINDEX_PAGE = 2000
# Script calls in flight at once (coalesced when auto_pipeline is on).
_CALLS_AT_ONCE = 32


class TeamSweeps(UsesBackends):
    """The team engine's scheduled work: expiry sweeps and the repair pass (the
    write-behind job calls the TeamRecordWriter itself)."""

    def __init__(
        self,
        backends: Backends,
        outbox: TeamRecordWriter,
        scripts: TeamScripts,
        recovery: TeamRecovery,
    ) -> None:
        super().__init__(backends)
        self._outbox = outbox
        self._teams = scripts
        self._recovery = recovery
        self._reindex_after = ""  # where the repair job's next re-index page starts

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
            "waitlist_expired": 0,
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
                    if index == "lock_due":  # entries in line expire on the same sweep
                        expired = await expire_entries(self._teams, activity_id, batch)
                        report["waitlist_expired"] += expired
                        touched = touched or expired > 0
                    # Its entry becomes its earliest due team again (or goes): after the
                    # sweep, so a team indexed meanwhile is never hidden behind a later score.
                    await self._teams.reindex(
                        activity_id,
                        team_index(activity_id),
                        due_index,
                        self._also(index, activity_id),
                    )
                    if touched:
                        await self._outbox.drain_quietly(activity_id)
                if len(due) == batch and fresh:
                    more.append(slot)
            if not more:
                break
            slots = more
        return report

    def _also(self, index: str, activity_id: str) -> str | None:
        """What else makes an activity due on the index: the waitlist's entry ends, on the
        lock sweep."""
        return self._keys.waitlist_due(activity_id) if index == "lock_due" else None

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
                report["teams"] += 1
                if swept.code is TeamCode.OK:
                    report["locks_expired"] += swept.locks_expired
                    ended = swept.status if swept.ended_now else ""
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
        # expires by itself (ACTIVITY_COPY_TTL_MS).
        released = 0
        for activity_id in sorted({activity_id for activity_id, _team in ended}):
            # Its counts go with the copy and come back from SQL: SQL must have every record.
            await self._outbox.drain_quietly(activity_id)
            released += await self._teams.release(activity_id)
        return {"teams_released": len(ended), "activities_released": released}

    async def reindex(self, page: int = REINDEX_PAGE, restore_limit: int = 500) -> dict[str, int]:
        """Put back lost index entries for the next page of SQL's activities: the repair
        job's slow safety net (a full pass takes activities / page runs). An outbox stream
        with records waiting goes back in the pending index, an activity with locks or open
        teams back in the due indexes at its earliest; then the next page of SQL's open teams
        is checked against Redis and those it lost are rebuilt (TeamRecovery.restore_missing)."""
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
                also = (
                    None
                    if team_index != keys.lock_index(activity_id)
                    else keys.waitlist_due(activity_id)
                )
                calls.append(partial(self._teams.reindex, activity_id, team_index, due_index, also))
        for start in range(0, len(calls), _CALLS_AT_ONCE):
            await asyncio.gather(*(call() for call in calls[start : start + _CALLS_AT_ONCE]))
        self._reindex_after = ids[-1] if len(ids) == page else ""
        restored = await self._recovery.restore_missing(page, restore_limit)
        return {"activities_reindexed": len(ids), "teams_restored": restored}
