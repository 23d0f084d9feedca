"""Write-behind of grabs: a Redis consumer group feeds SQL, one transaction per batch.

Each packet has its own outbox stream (its keys share one cluster slot). A batch is
applied in one SQL transaction and only then acknowledged and deleted, so a writer that
dies midway leaves its batch pending: it is read again by the same consumer after a
failed commit, or taken over (XAUTOCLAIM) by another writer once it has been idle for
`reclaim_idle_s`. Unique keys (grab per packet and user, ledger business keys) turn a
second application into a no-op, so "at least once" delivery records exactly once.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from typing import Any

import redis.exceptions
from sqlalchemy import select, update

from groupbuy.redpacket.models import PacketRow
from groupbuy.redpacket.records import apply_packet_records
from groupbuy.storage.backends import Backends, UsesBackends

log = logging.getLogger(__name__)

GROUP = "writers"
_PIPELINE_CHUNK = 500
_ENDED = ("sold_out", "expired")

Entries = list[tuple[str, dict[str, str]]]


class PacketRecordWriter(UsesBackends):
    """Drains packets' outbox streams into SQL as one consumer of the `writers` group."""

    def __init__(
        self,
        backends: Backends,
        batch_size: int,
        reclaim_idle_s: float,
        consumer: str | None = None,
    ) -> None:
        super().__init__(backends)
        self._batch_size = batch_size
        self._reclaim_idle_ms = int(reclaim_idle_s * 1000)
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"

    async def drain(self, packet_id: str) -> int:
        """Record every entry of one packet's stream now; returns how many were applied."""
        stream = self._keys.packet_outbox(packet_id)
        applied = 0
        while True:
            try:
                entries = await self._next_batch(stream)
            except redis.exceptions.ResponseError as exc:
                if not _missing_stream(exc):
                    raise
                # No stream: never created (pending send) or already fully recorded and dropped.
                await self._mark_done_if_ended(packet_id)
                return applied
            if not entries:
                return applied
            async with self._db.transaction() as session:
                await apply_packet_records(session, [fields for _entry_id, fields in entries])
                status = await session.scalar(
                    select(PacketRow.status).where(PacketRow.packet_id == packet_id)
                )
            ended = status in _ENDED  # nothing can be added to the stream after its ending
            ids = [entry_id for entry_id, _ in entries]
            _deleted, left = await self._scripts.call(
                "outbox_ack", [stream], [GROUP, "1" if ended else "0", *ids]
            )
            applied += len(entries)
            if ended and int(left) == 0:
                await self._mark_done_if_ended(packet_id)
                return applied

    async def _next_batch(self, stream: str) -> Entries:
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
                .where(PacketRow.packet_id == packet_id, PacketRow.status.in_(_ENDED))
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

    async def drain_all(self) -> int:
        """Drain every packet that may have records waiting."""
        total = 0
        for packet_id in await self.unrecorded_packets():
            total += await self.drain(packet_id)
        return total

    async def measure_backlog(self) -> tuple[int, int | None, int]:
        """(records waiting, ms timestamp of the oldest one or None, streams looked at).

        Acknowledged records are deleted, so a stream's length is its backlog. XLEN and
        XRANGE COUNT 1 per stream, pipelined in chunks: a few round trips in all.
        """
        packet_ids = await self.unrecorded_packets()
        records, oldest_ms = 0, None
        for start in range(0, len(packet_ids), _PIPELINE_CHUNK):
            pipe = self._redis.pipeline(transaction=False)
            for packet_id in packet_ids[start : start + _PIPELINE_CHUNK]:
                stream = self._keys.packet_outbox(packet_id)
                pipe.xlen(stream)
                pipe.xrange(stream, count=1)
            replies = await pipe.execute()
            for length, first in zip(replies[0::2], replies[1::2], strict=True):
                records += int(length)
                if first:
                    entry_ms = _stream_id_ms(first[0][0])
                    oldest_ms = entry_ms if oldest_ms is None else min(oldest_ms, entry_ms)
        return records, oldest_ms, len(packet_ids)

    async def backlog(self) -> int:
        """Records written by scripts and not yet in SQL."""
        return (await self.measure_backlog())[0]


def _stream_id_ms(entry_id: str | bytes) -> int:
    """The millisecond part of a stream entry id (`<ms>-<seq>`, Redis's clock at XADD)."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


def _entries(reply: Any) -> Entries:
    """Entries of a one-stream XREADGROUP reply (a list under RESP2, a dict under RESP3)."""
    if not reply:
        return []
    batches = reply.values() if isinstance(reply, dict) else (batch for _stream, batch in reply)
    # An entry deleted while pending comes back without fields: nothing to apply.
    return [(entry_id, fields) for batch in batches for entry_id, fields in batch if fields]


def _missing_stream(exc: redis.exceptions.ResponseError) -> bool:
    """Whether a stream command failed because the stream (and so its group) is gone."""
    message = str(exc)
    # Redis says NOGROUP; fakeredis words it differently.
    return "NOGROUP" in message or "requires the key to exist" in message
