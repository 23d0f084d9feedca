"""Write-behind of the team scripts' records: an activity's outbox stream into SQL.

Every team record carries its own identity (a business key), so inserting it twice is a
no-op. That is why this writer needs no consumer group: it reads the stream from the
start, applies a batch in one SQL transaction, and only after the commit deletes the
batch from the stream. A writer that dies midway leaves the entries in place and the
next drain (of any process) applies them again harmlessly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.locks.codec import parse_team_record
from groupbuy.locks.records import project_team_records
from groupbuy.storage.backends import Backends
from groupbuy.storage.calls import outbox_ack
from groupbuy.storage.deadletters import DeadLetters, apply_isolating
from groupbuy.storage.events import record_events
from groupbuy.storage.keys import Keys
from groupbuy.storage.outbox import RecordWriter, RunTime, drain_each, read_outbox
from groupbuy.storage.reachability import Reachability

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActivityOutboxes:
    """The team records' layout: one outbox stream per activity, listed by activity id."""

    keys: Keys

    def stream(self, owner: str) -> str:
        """The activity's outbox stream."""
        return self.keys.outbox(owner)

    def index_of(self, owner: str) -> str:
        """The pending index of the activity's slot."""
        return self.keys.pending_activities(self.keys.activity_slot(owner))

    def index_in(self, slot: int | None) -> str:
        """The pending index of activities of one slot."""
        return self.keys.pending_activities(slot)


class TeamRecordWriter(RecordWriter):
    """Drains activities' outbox streams into SQL, one transaction per batch."""

    engine = "teams"

    def __init__(
        self,
        backends: Backends,
        batch_size: int,
        dead_letters: DeadLetters,
        reachability: Reachability | None = None,
    ) -> None:
        super().__init__(backends, ActivityOutboxes(backends.keys), batch_size, dead_letters)
        self._reachability = reachability or Reachability("the configured URL")
        self._project = project_team_records
        dead_letters.register(self.engine, self._apply)
        # Per stream: the drain running now, and the one queued to start after it.
        self._current: dict[str, asyncio.Task[int]] = {}
        self._queued: dict[str, asyncio.Task[int]] = {}

    async def drain_all(self, within: RunTime | None = None) -> int:
        """Drain every stream the pending index lists, oldest record first (one read of the
        index when nothing waits), until `within` runs out; returns how many records were
        applied."""
        return await drain_each(await self.pending(), self._drain_listed, within)

    async def _drain_listed(self, activity_id: str) -> int:
        applied = await self.drain(activity_id)
        if not applied:
            await self.ack(activity_id, [])  # listed, but nothing was there: set its entry right
        return applied

    async def drain(self, owner: str) -> int:
        """Apply every entry now in activity `owner`'s stream to SQL (not those written while
        it runs: the next drain has them); returns how many it applied.

        Callers share drains: one that is queued and has not started yet will see every
        entry written before this call, so a caller joins it instead of queueing its own.
        Under load (many confirms of one activity at once) that turns N drains into two.
        The drain runs in its own task, shielded: a cancelled caller never interrupts it
        mid-SQL.
        """
        queued = self._queued.get(owner)
        if queued is None:
            queued = asyncio.create_task(self._after(self._current.get(owner), owner))
            self._queued[owner] = queued
        return await asyncio.shield(queued)

    async def _after(self, previous: asyncio.Task[int] | None, activity_id: str) -> int:
        if previous is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        me = asyncio.current_task()
        assert me is not None
        if self._queued.get(activity_id) is me:
            del self._queued[activity_id]
        self._current[activity_id] = me
        try:
            return await self._drain(activity_id)
        finally:
            if self._current.get(activity_id) is me:
                del self._current[activity_id]

    async def _drain(self, activity_id: str) -> int:
        stream = self.layout.stream(activity_id)
        applied = 0
        # What the stream holds now, not until it is empty: an activity that keeps writing
        # faster than SQL takes its records (several replicas on one database) would hold
        # the drain, and every confirm and job waiting on it, for as long as its writes go
        # on. What comes later is the next drain's. A batch that is not full was the rest;
        # when more than a batch waits, the drain stops at the newest entry there now.
        last_id = "+"
        while True:
            entries = await read_outbox(self._scripts, stream, "-", last_id, self._batch_size)
            if not entries:
                return applied
            if last_id == "+" and len(entries) == self._batch_size:
                last_id = (await self._redis.xrevrange(stream, "+", "-", count=1))[0][0]

            async def apply(batch: list[tuple[str, dict[str, str]]]) -> None:
                async with self._db.transaction() as session:
                    await self._apply(session, [fields for _id, fields in batch])

            poisoned = await apply_isolating(entries, apply)
            if poisoned:  # out of the stream (into the dead letters) before the rest is acked
                index = self.layout.index_of(activity_id)
                await self._dead.bury(self.engine, activity_id, stream, index, "", poisoned)
            dead = {p.entry_id for p in poisoned}
            await self.ack(
                activity_id, [entry_id for entry_id, _ in entries if entry_id not in dead]
            )
            applied += self._written(len(entries) - len(poisoned))
            if len(entries) < self._batch_size:
                return applied

    async def _apply(self, session: AsyncSession, fields: list[dict[str, str]]) -> None:
        """Parse records, project them into rows and record their events, in the caller's
        transaction."""
        records = [parse_team_record(f) for f in fields]
        await record_events(session, await self._project(session, records))

    async def ack(self, activity_id: str, ids: list[str]) -> int:
        """Delete recorded entries and set the stream's pending-index entry from what is
        left (no ids: only that); returns how many entries are left."""
        # Only scripts add to a team stream, and they recreate it: an empty one can go.
        acked = await outbox_ack(
            self._scripts,
            self.layout.stream(activity_id),
            self.layout.index_of(activity_id),
            group="",
            drop_empty=True,
            member=activity_id,
            ids=ids,
        )
        return acked.left

    async def drain_quietly(self, activity_id: str) -> None:
        """Drain, logging instead of raising: the background job will retry what failed.
        Only for answers that promise nothing about SQL (a confirm calls `drain`)."""
        try:
            await self.drain(activity_id)
        except Exception as error:
            # Redis or the database away: each says so once per outage, not once per call.
            if self._reachability.failed(error) or self._db.reachability.failed(error):
                return
            log.warning(
                "outbox flush of %s failed; will retry in the background",
                activity_id,
                exc_info=True,
            )
