"""Write-behind of grabs: a Redis consumer group feeds SQL, one transaction per batch.

Each packet has its own outbox stream (its keys share one cluster slot). A batch is
applied in one SQL transaction and only then acknowledged and deleted, so a writer that
dies midway leaves its batch pending: it is read again by the same consumer after a
failed commit, or taken over (XAUTOCLAIM) by another writer once it has been idle for
`reclaim_idle_s`. Unique keys (grab per packet and user, ledger business keys) turn a
second application into a no-op, so "at least once" delivery records exactly once.
A record SQL can never apply (a poison record) is isolated by splitting its batch and
moved to the dead letters (groupbuy/storage/deadletters.py); the rest of the batch is
applied, and a transient failure (SQL down or locked) leaves the whole batch pending.

The writer finds its work through the pending index (one per slot in use in Redis
Cluster), which the packet scripts keep in the same call as the XADD (a packet is listed
from its first waiting record until `outbox_ack` leaves its stream empty): a round reads
the index once and visits only the packets listed, never the idle ones, a batch of each in
turn, so that one huge stream does not hold up the others. An entry that is
lost anyway (a partial loss of Redis data, streams written before the index existed) is
put back by `reindex`, which the repair job runs over SQL's unrecorded packets a page at
a time.

Within one writer, drains of one packet run one at a time (the flush job's, an expiry's,
an operator's): a drain that starts while another holds a batch it has read but not yet
committed waits for it, so the records waiting when a drain began are in SQL when it returns
(unless another process's writer holds them, or they went to the dead letters). Side by
side, the later drain could find nothing left to read (the batch delivered to the other)
and return while those records were still on their way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis.exceptions
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.redpacket.models import ENDED, PacketRow
from groupbuy.redpacket.recording import apply_packet_records, record_packet_batch
from groupbuy.redpacket.records import parse_packet_record
from groupbuy.storage.backends import Backends
from groupbuy.storage.calls import outbox_ack
from groupbuy.storage.deadletters import DeadLetters, apply_isolating
from groupbuy.storage.keys import Keys
from groupbuy.storage.outbox import RecordWriter, RunTime, read_outbox

log = logging.getLogger(__name__)

GROUP = "writers"
# Script calls in flight at once (coalesced into pipelines when auto_pipeline is on; a
# connection each otherwise, so fewer than the pool holds).
CALLS_AT_ONCE = 32
# Packets whose batches drain_all has on their way at once: two keep both sides busy (one
# writes SQL while the other talks to Redis); more would only queue for SQLite's writer.
LANES = 2

Entries = list[tuple[str, dict[str, str]]]


@dataclass(frozen=True)
class PacketOutboxes:
    """The packet records' layout: one outbox stream per packet, listed by packet id."""

    keys: Keys

    def stream(self, owner: str) -> str:
        """The packet's outbox stream."""
        return self.keys.packet_outbox(owner)

    def index_of(self, owner: str) -> str:
        """The pending index of the packet's slot."""
        return self.keys.packet_keys(owner).pending

    def index_in(self, slot: int | None) -> str:
        """The pending index of packets of one slot."""
        return self.keys.pending_packets(slot)


async def apply_packet_fields(session: AsyncSession, fields: list[dict[str, str]]) -> None:
    """Parse outbox entries' fields into packet records and apply them to SQL."""
    await apply_packet_records(session, [parse_packet_record(f) for f in fields])


class PacketRecordWriter(RecordWriter):
    """Drains packets' outbox streams into SQL as one consumer of the `writers` group."""

    engine = "packets"

    def __init__(
        self,
        backends: Backends,
        batch_size: int,
        reclaim_idle_s: float,
        consumer: str | None = None,
        dead_letters: DeadLetters | None = None,
    ) -> None:
        dead = dead_letters or DeadLetters(backends)
        super().__init__(backends, PacketOutboxes(backends.keys), batch_size, dead)
        self._dead.register(self.engine, apply_packet_fields)
        self._reclaim_idle_ms = int(reclaim_idle_s * 1000)
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        # Per packet: the lock its drains take turns on, and how many drains want it.
        self._draining: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def _one_drain_at_a_time(self, packet_id: str) -> AsyncIterator[None]:
        lock, users = self._draining.get(packet_id, (asyncio.Lock(), 0))
        self._draining[packet_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._draining[packet_id]
            if users == 1:
                del self._draining[packet_id]
            else:
                self._draining[packet_id] = (lock, users - 1)

    async def drain(self, owner: str) -> int:
        """Record every entry of packet `owner`'s stream now; returns how many were applied.

        A drain of the same packet already running in this writer is waited for first: the
        batch it holds is this consumer's, delivered and not yet committed."""
        async with self._one_drain_at_a_time(owner):
            applied, more = await self._batch(owner)
            while more:
                done, more = await self._batch(owner)
                applied += done
            return applied

    async def _next_of(self, packet_id: str) -> tuple[int, bool]:
        """Record the next batch of one packet's stream (waiting its turn, as a drain does);
        returns how many records it applied and whether more may wait."""
        async with self._one_drain_at_a_time(packet_id):
            return await self._batch(packet_id)

    async def _batch(self, packet_id: str) -> tuple[int, bool]:
        stream = self.layout.stream(packet_id)
        try:
            entries = await self._next_batch(stream)
        except redis.exceptions.ResponseError as exc:
            if not _missing_stream(exc):
                raise
            # No stream: never created (pending send) or already fully recorded and dropped.
            await self._mark_done_if_ended(packet_id)
            await self.ack(packet_id, [])  # and nothing for the index to list
            return 0, False
        if not entries:
            return 0, False
        status: str | None = None

        async def apply(batch: Entries) -> None:
            nonlocal status
            records = [parse_packet_record(fields) for _entry_id, fields in batch]
            status = await record_packet_batch(self._db, packet_id, records)

        poisoned = await apply_isolating(entries, apply)
        if poisoned:
            # Out of the stream (into the dead letters) before the rest is acknowledged,
            # and the status read again: the last sub-batch may have been the poison.
            pending = self.layout.index_of(packet_id)
            await self._dead.bury(self.engine, packet_id, stream, pending, GROUP, poisoned)
            async with self._db.sessions() as session:
                status = await session.scalar(
                    select(PacketRow.status).where(PacketRow.packet_id == packet_id)
                )
        dead = {p.entry_id for p in poisoned}
        ended = status in ENDED  # nothing can be added to the stream after its ending
        done = [entry_id for entry_id, _ in entries if entry_id not in dead]
        left = await self.ack(packet_id, done, ended)
        if ended and left == 0:
            await self._mark_done_if_ended(packet_id)
        # What is left may be another consumer's (read, not yet acknowledged): the next
        # batch then finds nothing and the drain ends.
        return self._written(len(done)), left > 0

    async def ack(self, packet_id: str, ids: list[str], ended: bool = False) -> int:
        """Acknowledge and delete recorded entries (the stream too once `ended` and empty),
        and set the packet's pending-index entry from what is left (no ids: only that);
        returns how many entries are left."""
        keys = self._keys.packet_keys(packet_id)
        acked = await outbox_ack(
            self._scripts,
            keys.outbox,
            keys.pending,
            group=GROUP,
            drop_empty=ended,
            member=packet_id,
            ids=ids,
        )
        return acked.left

    async def _next_batch(self, stream: str) -> Entries:
        entries = await self._delivered(stream)
        if not entries or self._scripts.replica_wait is None:
            return entries
        # [redis] wait_replicas: SQL takes only records the replicas hold. The batch's range
        # is read again by outbox_read, whose WAIT vouches for what the server that answers
        # holds; an entry it holds otherwise (a server promoted since) waits for a later read.
        held = dict(
            await read_outbox(
                self._scripts, stream, entries[0][0], entries[-1][0], 2 * len(entries)
            )
        )
        return [(entry_id, fields) for entry_id, fields in entries if held.get(entry_id) == fields]

    async def _delivered(self, stream: str) -> Entries:
        """This consumer's next batch of the stream, as the consumer group delivers it."""
        # 1. what this consumer read before and did not acknowledge (its commit failed)
        mine = await self._redis.xreadgroup(
            GROUP, self.consumer, {stream: "0"}, count=self._batch_size
        )
        entries = _entries(mine)
        if entries:
            return entries
        # 2. what a dead consumer left pending for longer than reclaim_idle_s
        _next, claimed, *_ = await self._redis.xautoclaim(
            stream, GROUP, self.consumer, self._reclaim_idle_ms, "0-0", count=self._batch_size
        )
        claimed = [(entry_id, fields) for entry_id, fields in claimed if fields]
        if claimed:
            return claimed
        # 3. new records
        fresh = await self._redis.xreadgroup(
            GROUP, self.consumer, {stream: ">"}, count=self._batch_size
        )
        return _entries(fresh)

    async def _mark_done_if_ended(self, packet_id: str) -> None:
        async with self._db.transaction() as session:
            await session.execute(
                update(PacketRow)
                .where(PacketRow.packet_id == packet_id, PacketRow.status.in_(ENDED))
                .values(records_done=True)
            )

    async def unrecorded_packets(self) -> list[str]:
        """Packets whose stream may still hold records (live, or ended but not drained)."""
        async with self._db.sessions() as session:
            rows = await session.scalars(
                select(PacketRow.packet_id).where(
                    PacketRow.records_done.is_(False), PacketRow.status != "pending"
                )
            )
            return list(rows.all())

    async def drain_all(self, within: RunTime | None = None) -> int:
        """Record what the packets the pending index lists have waiting, oldest record first,
        a batch of each in turn (one huge stream does not hold up the others), until nothing
        is left or `within` runs out (the first batch always runs). Each round reads the
        index again (one read when nothing waits); returns how many records were applied."""
        run = _Round(within or RunTime())
        listed = await self.pending()
        while listed and not run.failures and not run.within.ran_out:
            run.visits, run.more = iter(listed), []
            # Two lanes (LANES): while one batch's SQL transaction runs, the other's records
            # are read from Redis or acknowledged there.
            await asyncio.gather(*(self._lane(run) for _ in range(LANES)))
            # The next round visits every packet listed now, not only those left with more:
            # one caught up in this round may have new records already, and they would wait
            # for the run's end, which another busy packet can put off for the whole run.
            listed = await self.pending() if run.more else []
        if run.failures:
            raise run.failures[0]
        return run.applied

    async def _lane(self, run: _Round) -> None:
        """Visit the round's packets one batch each, with the other lanes, until the round
        is done, its time is out or a lane failed."""
        for packet_id in run.visits:  # shared by the lanes: each packet is visited once
            if run.failures or (run.started and not run.within.allows()):
                return
            run.started = True
            try:
                with run.within.step():
                    done, left = await self._next_of(packet_id)
                if not done:
                    # Listed, yet nothing to apply: its records wait for another writer (the
                    # entry stays, scored by the oldest), or the entry was stale (it goes).
                    await self.ack(packet_id, [])
            except Exception as error:
                # SQL or Redis away: the other lanes finish the batch they hold, then stop,
                # and drain_all raises this once they have.
                run.failures.append(error)
                return
            run.applied += done
            if left:
                run.more.append(packet_id)

    async def reindex(self, packet_ids: list[str]) -> None:
        """Set these packets' pending-index entries from their streams: listed, scored by
        the oldest record, when records wait; out otherwise (the repair job's safety net)."""
        for start in range(0, len(packet_ids), CALLS_AT_ONCE):
            chunk = packet_ids[start : start + CALLS_AT_ONCE]
            await asyncio.gather(*(self.ack(packet_id, []) for packet_id in chunk))


@dataclass
class _Round:
    """A drain_all run as its lanes share it: the time it may take, the packets left to
    visit this round, those to visit again, what was applied, and the failures met."""

    within: RunTime
    visits: Iterator[str] = iter(())
    more: list[str] = field(default_factory=list)
    applied: int = 0
    started: bool = False  # the first batch always runs
    failures: list[Exception] = field(default_factory=list)


def _entries(reply: Any) -> Entries:
    """Entries of a one-stream XREADGROUP reply (a list under RESP2, a dict under RESP3)."""
    if not reply:
        return []
    batches = reply.values() if isinstance(reply, dict) else (batch for _stream, batch in reply)
    # An entry deleted while pending comes back without fields: nothing to apply.
    return [(entry_id, fields) for batch in batches for entry_id, fields in batch if fields]


def _missing_stream(exc: redis.exceptions.ResponseError) -> bool:
    """Whether a stream command failed because the stream (and so its group) is gone."""
    return "NOGROUP" in str(exc)
