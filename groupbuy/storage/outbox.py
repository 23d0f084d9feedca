"""Write-behind from Redis to SQL: scripts append records to an outbox stream in the
same atomic call as the state change; this writer turns them into SQL rows.

Every record carries its own identity (a business key), so inserting it twice is a
no-op. That is why the writer needs no consumer group: it reads the stream from the
start, applies a batch in one SQL transaction, and only after the commit deletes the
batch from the stream. A writer that dies midway leaves the entries in place and the
next flush (of any process) applies them again harmlessly. A record that can never be
applied goes to the dead letters (groupbuy/storage/deadletters.py) without holding up
the rest of its batch.

The scripts also list each stream that has records waiting in a pending index (a sorted
set, member -> ms of its oldest record), and `outbox_ack` takes it out once the stream
is empty, so `flush_pending` visits only the streams with work, however many are idle.
In Redis Cluster there is one pending index per slot (each stream is listed in its own
slot's), and `flush_pending` reads the index of every slot in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.storage.calls import outbox_ack, outbox_read
from groupbuy.storage.db import Database
from groupbuy.storage.deadletters import DeadLetters, apply_isolating
from groupbuy.storage.events import Event, record_events
from groupbuy.storage.reachability import Reachability
from groupbuy.storage.scripts import Scripts, reply_dict
from groupbuy.storage.slots import SlotDirectory, oldest_first

log = logging.getLogger(__name__)

Projector = Callable[[AsyncSession, list[dict[str, str]]], Awaitable[list[Event]]]


# Most streams one flush_pending round visits; the rest wait for the next round.
ROUND_STREAMS = 5000


async def read_outbox(
    scripts: Scripts, stream: str, first: str, last: str, count: int
) -> list[tuple[str, dict[str, str]]]:
    """Up to `count` entries of an outbox stream, from id `first` to id `last` (inclusive);
    with `[redis] wait_replicas`, only once the replicas hold them, else
    RedisReplicationTimeout: SQL must not take a record that a failover could take back
    from Redis, and a retried grab would then get another share than the row SQL kept."""
    waits = scripts.replica_wait is not None
    entries = await outbox_read(scripts, stream, first=first, last=last, most=count, publish=waits)
    return [(entry_id, reply_dict(fields)) for entry_id, fields in entries]


class OutboxWriter:
    """Drains outbox streams into SQL, one transaction per batch.

    A stream is named by its member in the pending index: an activity id, whose stream is
    `stream_of(member)` and whose pending index is `index_of(member)`; `index_in(slot)` is
    the pending index of a slot of the directory (`slots`), all of them one key on one
    Redis server.
    """

    def __init__(
        self,
        redis: Any,
        scripts: Scripts,
        database: Database,
        project: Projector,
        batch_size: int,
        index_of: Callable[[str], str],
        index_in: Callable[[int | None], str],
        stream_of: Callable[[str], str],
        slots: SlotDirectory,
        dead_letters: DeadLetters,
        reachability: Reachability | None = None,
    ) -> None:
        self._redis = redis
        self._reachability = reachability or Reachability("the configured URL")
        self._scripts = scripts
        self._db = database
        self._project = project
        self._batch_size = batch_size
        self._index_of = index_of
        self._index_in = index_in
        self._stream_of = stream_of
        self._slots = slots
        self._dead = dead_letters
        dead_letters.register("teams", self._apply)
        # Per stream: the flush running now, and the one queued to start after it.
        self._current: dict[str, asyncio.Task[int]] = {}
        self._queued: dict[str, asyncio.Task[int]] = {}

    async def pending(self, limit: int = ROUND_STREAMS) -> list[str]:
        """The members whose streams have records waiting, oldest record first (at most
        `limit`, over the pending index of every slot in use)."""
        indexes = [self._index_in(slot) for slot in await self._slots.in_use()]
        return await oldest_first(self._redis, indexes, limit)

    async def flush_pending(self, within: RunTime | None = None) -> int:
        """Flush every stream the pending index lists, oldest record first (one read of the
        index when nothing waits), until `within` runs out; returns how many records were
        applied."""
        return await flush_each(await self.pending(), self._flush_listed, within)

    async def _flush_listed(self, member: str) -> int:
        applied = await self.flush(member)
        if not applied:
            await self.ack(member, [])  # listed, but nothing was there: set its entry right
        return applied

    async def flush(self, member: str) -> int:
        """Apply every entry now in `member`'s stream to SQL (not those written while it
        runs: the next flush has them); returns how many it applied.

        Callers share flushes: one that is queued and has not started yet will see every
        entry written before this call, so a caller joins it instead of queueing its own.
        Under load (many confirms of one activity at once) that turns N flushes into two.
        The flush runs in its own task, shielded: a cancelled caller never interrupts it
        mid-SQL.
        """
        queued = self._queued.get(member)
        if queued is None:
            queued = asyncio.create_task(self._after(self._current.get(member), member))
            self._queued[member] = queued
        return await asyncio.shield(queued)

    async def _after(self, previous: asyncio.Task[int] | None, member: str) -> int:
        if previous is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        me = asyncio.current_task()
        assert me is not None
        if self._queued.get(member) is me:
            del self._queued[member]
        self._current[member] = me
        try:
            return await self._drain(member)
        finally:
            if self._current.get(member) is me:
                del self._current[member]

    async def _drain(self, member: str) -> int:
        stream = self._stream_of(member)
        applied = 0
        # What the stream holds now, not until it is empty: an activity that keeps writing
        # faster than SQL takes its records (several replicas on one database) would hold
        # the drain, and every confirm and job waiting on it, for as long as its writes go
        # on. What comes later is the next flush's. A batch that is not full was the rest;
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
                await self._dead.bury("teams", member, stream, self._index_of(member), "", poisoned)
            dead = {p.entry_id for p in poisoned}
            await self.ack(member, [entry_id for entry_id, _ in entries if entry_id not in dead])
            applied += len(entries) - len(poisoned)
            if len(entries) < self._batch_size:
                return applied

    async def _apply(self, session: AsyncSession, records: list[dict[str, str]]) -> None:
        """Project records into rows and record their events, in the caller's transaction."""
        await record_events(session, await self._project(session, records))

    async def ack(self, member: str, ids: list[str]) -> int:
        """Delete recorded entries and set the stream's pending-index entry from what is
        left (no ids: only that); returns how many entries are left."""
        # Only scripts add to a team stream, and they recreate it: an empty one can go.
        acked = await outbox_ack(
            self._scripts,
            self._stream_of(member),
            self._index_of(member),
            group="",
            drop_empty=True,
            member=member,
            ids=ids,
        )
        return acked.left

    async def flush_quietly(self, member: str) -> None:
        """Flush, logging instead of raising: the background loop will retry what failed.
        Only for answers that promise nothing about SQL (a confirm calls `flush`)."""
        try:
            await self.flush(member)
        except Exception as error:
            # Redis or the database away: each says so once per outage, not once per call.
            if self._reachability.failed(error) or self._db.reachability.failed(error):
                return
            log.warning(
                "outbox flush of %s failed; will retry in the background", member, exc_info=True
            )


class RunTime:
    """The time a flush run may take: `seconds` from now, or no limit (None).

    A run asks `allows()` before each step after its first (so every run moves), and a step
    is allowed only while it would end in time, judged by the slowest step so far: a run
    that must end before the scheduler's next tick then ends before it, unless one step is
    slower than the whole time.
    """

    def __init__(self, seconds: float | None = None) -> None:
        self._deadline = None if seconds is None else time.monotonic() + seconds
        self._slowest = 0.0
        self.ran_out = False  # a step was refused: work was left for the next run

    def allows(self) -> bool:
        """Whether another step fits in the time left (always, without a limit)."""
        if self._deadline is not None and time.monotonic() + self._slowest > self._deadline:
            self.ran_out = True
        return not self.ran_out

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Time one step (a batch, a stream's flush) for the estimate `allows()` makes."""
        began = time.monotonic()
        try:
            yield
        finally:
            self._slowest = max(self._slowest, time.monotonic() - began)


async def flush_each(
    members: Iterable[str], flush: Callable[[str], Awaitable[int]], within: RunTime | None = None
) -> int:
    """Run `flush` on each member in turn (the first failure stops the round, as SQL or
    Redis being down fails every one), until `within` runs out (the first always runs);
    returns how many records were applied."""
    within = within or RunTime()
    applied = 0
    for count, member in enumerate(members):
        if count and not within.allows():
            break
        with within.step():
            applied += await flush(member)
    return applied
