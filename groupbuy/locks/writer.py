"""Write-behind of the team scripts' records: an activity's outbox stream into SQL.

Every team record carries its own identity (a business key), so inserting it twice is a
no-op. That is why this writer needs no consumer group: it reads the stream from the
start, applies a batch in one SQL transaction, and only after the commit deletes the
batch from the stream. A writer that dies midway leaves the entries in place and the
next drain (of any process) applies them again harmlessly.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.locks.funnel import count_committed, count_when_committed
from groupbuy.locks.records import TeamBatch, parse_team_record, project_team_records
from groupbuy.storage.backends import Backends
from groupbuy.storage.bulk import Moments
from groupbuy.storage.calls import outbox_ack
from groupbuy.storage.deadletters import DeadLetters, Entries, apply_isolating, is_poison
from groupbuy.storage.events import FEED_COMMITTED, event_steps, record_events
from groupbuy.storage.groupcommit import GroupCommit, Waiters
from groupbuy.storage.keys import Keys
from groupbuy.storage.outbox import RecordWriter, RunTime, drain_each, read_outbox
from groupbuy.storage.reachability import Reachability
from groupbuy.storage.steps import Steps

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


def _one_lane(_owner: str) -> str:
    return ""


def _own_lane(owner: str) -> str:
    return owner


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
        dead_letters.register(self.engine, self._apply)
        # SQLite takes one writer at a time: every activity in one lane, their records in
        # shared transactions. PostgreSQL takes them side by side: a lane per activity.
        self._rounds = GroupCommit(self._commit, _one_lane if self._db.is_sqlite else _own_lane)
        # Per activity: entries committed whose acknowledgement is on its way. The lane's
        # next round starts meanwhile (GroupCommit) and reads past them.
        self._acking: dict[str, set[str]] = {}
        self._ack_ended = asyncio.Event()  # set (then replaced) as each acknowledgement ends

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

        Callers share drains (groupbuy/storage/groupcommit.py): a caller joins its lane's
        round that has not started yet, which reads every stream it lists after the
        caller's entries were written, and commits the activities' records together, at
        most a batch to a transaction. On SQLite every activity is in one lane; on
        PostgreSQL each has its own. Many confirms at once cost about two rounds instead
        of a transaction each.
        """
        return await self._rounds.join(owner)

    async def committed(self, owner: str) -> int:
        """As `drain`, but returns once the owner's records are committed, before the
        round acknowledges them in Redis: for an answer that waits on SQL (a confirm). An
        acknowledgement that fails leaves the entries to a later drain, a no-op."""
        return await self._rounds.join(owner, settled=False)

    async def _commit(self, waiters: Waiters) -> None:
        """One round: read each listed stream, commit the short ones' records together, then
        drain the long ones (a full batch waiting) one by one."""
        owners = list(waiters)
        reads = await asyncio.gather(*(self._read(owner, "+") for owner in owners))
        long: list[tuple[str, Entries]] = []
        group: list[tuple[str, Entries]] = []
        size = 0
        for owner, entries in zip(owners, reads, strict=True):
            if not entries:
                waiters[owner].set_result(0)
            elif len(entries) >= self._batch_size:
                long.append((owner, entries))
            else:
                if size + len(entries) > self._batch_size:
                    await self._commit_together(group, waiters)
                    group, size = [], 0
                group.append((owner, entries))
                size += len(entries)
        await self._commit_together(group, waiters)
        for owner, entries in long:
            waiters[owner].set_result(await self._drain_long(owner, entries))

    async def _commit_together(self, group: list[tuple[str, Entries]], waiters: Waiters) -> None:
        """Several activities' records (under a batch in all) in one transaction; when one
        of them cannot be applied, each activity's on its own (its poison to the dead
        letters)."""
        if not group:
            return
        try:
            await self._write([f for _owner, entries in group for _id, f in entries])
        except Exception as exc:
            if not is_poison(exc):
                raise
            for owner, entries in group:
                waiters[owner].set_result(await self._apply_batch(owner, entries))
            return
        for owner, entries in group:  # committed: `committed` callers go on now
            waiters[owner].set_result(self._written(len(entries)))
        await self._ack_committed(
            {owner: [entry_id for entry_id, _ in entries] for owner, entries in group}
        )

    async def _ack_committed(self, acked: dict[str, list[str]]) -> None:
        """Acknowledge entries committed, per activity; a round that reads meanwhile reads
        past them (`_read`)."""
        for owner, ids in acked.items():
            self._acking.setdefault(owner, set()).update(ids)
        try:
            await asyncio.gather(*(self.ack(owner, ids) for owner, ids in acked.items()))
        finally:
            for owner, ids in acked.items():
                acking = self._acking[owner]
                acking.difference_update(ids)
                if not acking:
                    del self._acking[owner]
            ended, self._ack_ended = self._ack_ended, asyncio.Event()
            ended.set()

    async def _read(self, activity_id: str, last_id: str) -> Entries:
        """The stream's next batch up to `last_id`, past the entries being acknowledged."""
        stream = self.layout.stream(activity_id)
        while True:
            entries = await read_outbox(self._scripts, stream, "-", last_id, self._batch_size)
            acking = self._acking.get(activity_id)
            if not acking:
                return entries
            kept = [(entry_id, fields) for entry_id, fields in entries if entry_id not in acking]
            if len(kept) == len(entries) or len(entries) < self._batch_size:
                return kept
            # A full read that held entries on their way out: what lies past the batch would
            # be missed. Those acknowledgements take a Redis round trip: wait, read again.
            while self._acking.get(activity_id):
                await self._ack_ended.wait()

    async def _drain_long(self, activity_id: str, entries: Entries) -> int:
        """The rest of a stream that held a full batch or more, batch by batch: up to its
        newest entry now, not until it is empty. An activity that keeps writing faster than
        SQL takes its records (several replicas on one database) would hold the drain, and
        every confirm and job waiting on it, for as long as its writes go on."""
        stream = self.layout.stream(activity_id)
        last_id = (await self._redis.xrevrange(stream, "+", "-", count=1))[0][0]
        applied = 0
        while True:
            applied += await self._apply_batch(activity_id, entries)
            if len(entries) < self._batch_size:
                return applied
            entries = await self._read(activity_id, last_id)
            if not entries:
                return applied

    async def _apply_batch(self, activity_id: str, entries: Entries) -> int:
        """One activity's batch, a transaction (poison isolated, buried), then acked."""

        async def apply(batch: Entries) -> None:
            await self._write([fields for _id, fields in batch])

        poisoned = await apply_isolating(entries, apply)
        if poisoned:  # out of the stream (into the dead letters) before the rest is acked
            stream, index = self.layout.stream(activity_id), self.layout.index_of(activity_id)
            await self._dead.bury(self.engine, activity_id, stream, index, "", poisoned)
        dead = {p.entry_id for p in poisoned}
        await self.ack(activity_id, [entry_id for entry_id, _ in entries if entry_id not in dead])
        return self._written(len(entries) - len(poisoned))

    async def _write(self, fields: list[dict[str, str]]) -> None:
        """Apply a batch of records in one urgent transaction (a confirm may wait on it).

        The rows are built first; the transaction runs them and the events as steps (on
        a SQLite file in one call: groupbuy/storage/sqlite_writer.py), so it holds the
        single writer for its statements alone. Its events are fed and counted (the
        console's funnel, groupbuy/locks/funnel.py) once it commits."""
        moments = Moments(self._db.engine.dialect)
        batch = TeamBatch.of([parse_team_record(f) for f in fields], moments)

        def steps() -> Steps[None]:
            yield from batch.steps()
            yield from event_steps(batch.events, moments)

        await self._db.run_steps(steps, urgent=True, topics=(FEED_COMMITTED,), records=len(fields))
        count_committed(batch.events)

    async def _apply(self, session: AsyncSession, fields: list[dict[str, str]]) -> None:
        """Parse records, project them into rows and record their events, in the caller's
        transaction (a dead letter replayed)."""
        records = [parse_team_record(f) for f in fields]
        events = await project_team_records(session, records)
        await record_events(session, events)
        count_when_committed(session, events)  # the console's funnel (groupbuy/locks/funnel.py)

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
