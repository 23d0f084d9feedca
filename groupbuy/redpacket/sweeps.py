"""SweepService: what time does to packets, run by the scheduled jobs (packet_expire: its
spec and call are here).

Expire the packets whose time is up (their refund recorded once), put back lost index
entries (rebuilding packets Redis lost), and release from Redis the ended packets SQL holds
in full. The write-behind job calls the PacketRecordWriter itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import select, update

from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.models import ENDED, PacketRow
from groupbuy.redpacket.recovery import RecoveryService
from groupbuy.redpacket.specs import (
    EXISTING,
    NO_PACKET,
    OK,
    PACKET_ARGV,
    PACKET_KEYS,
    PACKET_NOT_FOUND,
    PacketReply,
    PacketScripts,
)
from groupbuy.redpacket.writer import CALLS_AT_ONCE, PacketRecordWriter
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.slots import due_in
from groupbuy.storage.specs import ScriptSpec, shape

# The repair job's re-index page: SQL rows per run.
REINDEX_PAGE = 5000

PACKET_EXPIRE = ScriptSpec(
    "packet_expire",
    "Close a packet whose time is up and record its refund, exactly once.",
    keys=PACKET_KEYS,
    args=PACKET_ARGV,
    replies={
        OK: shape("closed now, its refund recorded", ("refunded_cents", int)),
        PacketCode.NOT_DUE: shape("its time is not up yet", ("expires_ms", int)),
        EXISTING: shape("it had ended before: sold_out, expired or withdrawn", ("status", str)),
        PACKET_NOT_FOUND: NO_PACKET,
    },
)


async def packet_expire(packets: PacketScripts, packet_id: str) -> PacketReply:
    """packet_expire."""
    return await packets.run(PACKET_EXPIRE, packet_id)


class SweepService(UsesBackends):
    """Expiry, re-indexing and release of packets: safe to repeat."""

    def __init__(
        self,
        backends: Backends,
        scripts: PacketScripts,
        writer: PacketRecordWriter,
        recovery: RecoveryService,
    ) -> None:
        super().__init__(backends)
        self._packets = scripts
        self._writer = writer
        self._recovery = recovery
        self._reindex_after = ""  # where the repair job's next re-index page starts

    async def expire(self, packet_id: str) -> dict[str, Any]:
        """Close the packet if its time is up; its refund is recorded exactly once."""
        reply = await packet_expire(self._packets, packet_id)
        if reply.code is PacketCode.OK:
            await self._writer.drain(packet_id)
            return {"packet_id": packet_id, "expired": True, "refunded_cents": reply.refunded_cents}
        # not due, ended before, or not in Redis
        return {"packet_id": packet_id, "expired": False, "reason": reply.code.name.lower()}

    async def expire_due(self, batch: int = 200, max_batches: int = 50) -> dict[str, int]:
        """Expire every active packet whose time is up (safe to repeat, from any process).

        The due index lists each active packet at its expiry (packet_create adds it, the
        script that ends the packet removes it), so a round reads only what is due; SQL's
        active packets are the repair job's to re-index (`reindex`).
        """
        now_ms = await self._clock.now_ms(self._redis)
        seen: set[str] = set()
        expired = 0
        slots = await self._slots.in_use()  # one due index per slot in Redis Cluster
        for _ in range(max_batches):
            listed = await due_in(
                self._redis, [self._keys.due_packets(slot) for slot in slots], now_ms, batch
            )
            more: list[int | None] = []
            for slot, due in zip(slots, listed, strict=True):
                fresh = [packet_id for packet_id in due if packet_id not in seen]
                for packet_id in fresh:
                    seen.add(packet_id)
                    expired += bool((await self.expire(packet_id))["expired"])
                if len(due) == batch and fresh:
                    more.append(slot)
            if not more:
                break
            slots = more
        return {"due": len(seen), "expired": expired}

    async def reindex(self, page: int = REINDEX_PAGE, restore_limit: int = 500) -> dict[str, int]:
        """Put back lost index entries for the next page of SQL's unfinished packets: the
        repair job's slow safety net (a full pass takes unfinished / page runs). A stream
        with records waiting goes back in the pending index; an active packet goes back in
        the due index (packet_expire re-indexes it, or expires it if its time is up), and
        one that Redis lost is rebuilt from SQL (at most `restore_limit` per run)."""
        async with self._db.sessions() as session:
            rows = (
                await session.execute(
                    select(PacketRow.packet_id, PacketRow.status)
                    .where(
                        PacketRow.records_done.is_(False),
                        PacketRow.status != "pending",
                        PacketRow.packet_id > self._reindex_after,
                    )
                    .order_by(PacketRow.packet_id)
                    .limit(page)
                )
            ).all()
        # A slot the directory lost (Redis lost data) is listed again, so the jobs read it.
        await self._slots.join(*(self._keys.packet_slot(packet_id) for packet_id, _ in rows))
        await self._writer.reindex([packet_id for packet_id, _status in rows])
        active = [packet_id for packet_id, status in rows if status == "active"]
        missing: list[str] = []
        for start in range(0, len(active), CALLS_AT_ONCE):
            chunk = active[start : start + CALLS_AT_ONCE]
            replies = await asyncio.gather(*(packet_expire(self._packets, p) for p in chunk))
            missing += [
                p
                for p, reply in zip(chunk, replies, strict=True)
                if reply.code is PacketCode.PACKET_NOT_FOUND
            ]
        restored = 0
        for packet_id in missing[:restore_limit]:
            restored += await self._recovery.restore(packet_id)
        done = len(rows) < page or len(missing) <= restore_limit
        if done:
            self._reindex_after = rows[-1][0] if len(rows) == page else ""
        return {"packets_reindexed": len(rows), "packets_restored": restored}

    async def release_ended(self, limit: int = 1000) -> dict[str, int]:
        """Remove from Redis the ended packets whose every record is in SQL."""
        async with self._db.sessions() as session:
            ended = (
                await session.scalars(
                    select(PacketRow.packet_id)
                    .where(
                        PacketRow.status.in_(ENDED),
                        PacketRow.records_done.is_(True),
                        PacketRow.redis_cleared.is_(False),
                    )
                    .limit(limit)
                )
            ).all()
        for packet_id in ended:
            packet = self._keys.packet_keys(packet_id)
            await self._redis.delete(*packet.own())
        if ended:
            async with self._db.transaction() as session:
                await session.execute(
                    update(PacketRow)
                    .where(PacketRow.packet_id.in_(ended))
                    .values(redis_cleared=True)
                )
        return {"packets_released": len(ended)}
