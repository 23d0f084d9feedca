"""RecoveryService: bring back a packet Redis does not hold, from its SQL record
(packet_restore: its spec and call are here).

A packet SQL records as live may be missing from Redis: a send whose Redis step has not
happened yet (it is made live now), or an active packet Redis lost (it is rebuilt). An
ended packet Redis has let go is answered from SQL instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from groupbuy_client import wire
from groupbuy_client.wire import from_ms, to_ms
from sqlalchemy import select

from groupbuy import errors
from groupbuy.metrics import RESTORED
from groupbuy.redpacket.codec import grab_value, share_value
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.commitment import Commitment, holds
from groupbuy.redpacket.grab import already_grabbed, refuse
from groupbuy.redpacket.models import GrabRow, PacketEpochRow, PacketRow
from groupbuy.redpacket.read import packet_version, recorded_grabs, recorded_packet
from groupbuy.redpacket.send import SendService
from groupbuy.redpacket.specs import (
    EXISTING,
    OK,
    PACKET_ARGV,
    PACKET_KEYS,
    RECORDED,
    PacketReply,
    PacketScripts,
    recorded_args,
)
from groupbuy.redpacket.split import split
from groupbuy.settings import RedPacketSettings
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.restore import rebuilding
from groupbuy.storage.specs import ScriptSpec, Slot, shape, slots

log = logging.getLogger(__name__)

PACKET_RESTORE = ScriptSpec(
    "packet_restore",
    "Rebuild a live packet that Redis has lost, from its SQL record, once.",
    keys=PACKET_KEYS,
    args=(
        *PACKET_ARGV,
        *RECORDED,
        *slots(
            ("epoch", "SQL's epoch, already raised (records of the lost epoch are fenced out)"),
            ("version", "above every version the lost state can have had"),
            ("grab_count", "the number of recorded grabs"),
        ),
    ),
    more_args=Slot(
        "grabs",
        "grab_count pairs (user_id, 'seq|amount|at_ms') in seq order, then the shares still "
        "to grab as 'amount|seq' (count - grab_count, in committed order), then the "
        "recipients",
    ),
    replies={
        OK: shape("rebuilt: active, or sold_out when every share was recorded", ("status", str)),
        EXISTING: shape("Redis has it (nothing changed)"),
    },
)


async def packet_restore(
    packets: PacketScripts, packet_id: str, grabs_then_shares: Sequence[Any], **fields: Any
) -> PacketReply:
    """packet_restore; `fields` are the named ARGV after PACKET_ARGV."""
    return await packets.run(PACKET_RESTORE, packet_id, grabs_then_shares, **fields)


class RecoveryService(UsesBackends):
    """Packets Redis lacks while SQL says they are live: made live, or rebuilt from SQL."""

    def __init__(
        self,
        backends: Backends,
        scripts: PacketScripts,
        limits: RedPacketSettings,
        sending: SendService,
    ) -> None:
        super().__init__(backends)
        self._packets = scripts
        self._limits = limits
        self._sending = sending

    async def grab_missing(self, packet_id: str, user_id: str) -> wire.Grabbed | None:
        """The grab path's one hook: put the packet back in Redis and answer None (grab
        again), or answer the grab from SQL when the packet has ended."""
        row = await recorded_packet(self._db, packet_id)
        if await self.bring_back(row):
            return None
        return await self._grab_from_record(row, user_id)

    async def bring_back(self, row: PacketRow) -> bool:
        """Put a packet Redis does not hold back in Redis when SQL says it should be live:
        a send whose Redis step has not happened yet, or an active packet Redis lost.
        False when its SQL record is the answer (it has ended)."""
        if row.status == "pending":
            await self._sending.make_live(row)
            return True
        if row.status == "active":
            await self.restore(row.packet_id)
            return True
        return False

    async def restore(self, packet_id: str) -> bool:
        """Rebuild an active packet that Redis lost, from SQL; True if this call rebuilt it.

        Its recorded grabs go back (nobody grabs twice, earlier grabs answer the same
        amounts) and the shares after them come back exactly as committed at send: the
        i-th grab still gets the i-th share. The packet's epoch is raised in SQL first,
        under the packet row's lock, so records Redis wrote before it lost the packet
        (still on their way to SQL) are fenced out and reported, never applied on top of
        the shares given again.
        """
        keys = self._keys
        async with rebuilding(
            self._redis, keys.packet_restoring(packet_id), keys.packet_keys(packet_id).hash
        ) as needed:
            if not needed:
                return False
            now_ms = await self._clock.now_ms(self._redis)
            async with self._db.transaction() as session:
                row = await session.scalar(
                    select(PacketRow).where(PacketRow.packet_id == packet_id).with_for_update()
                )
                if row is None or row.status != "active":
                    return False
                grabs = await recorded_grabs(session, packet_id)
                mark = await session.get(PacketEpochRow, packet_id)
                epoch = (mark.epoch if mark else 0) + 1
                if mark is None:
                    session.add(
                        PacketEpochRow(
                            packet_id=packet_id,
                            epoch=epoch,
                            rebuilt_at=from_ms(now_ms),
                            grabs_kept=len(grabs),
                        )
                    )
                else:
                    mark.epoch, mark.rebuilt_at, mark.grabs_kept = (
                        epoch,
                        from_ms(now_ms),
                        len(grabs),
                    )
            commitment, recipients = await self._sending.contents(row)
            undrawn = self._undrawn(row, commitment, grabs)
            shares = [share for _seq, share in undrawn]
            recorded: list[Any] = []
            for g in grabs:
                recorded += [g.user_id, grab_value(g.seq, g.amount_cents, to_ms(g.grabbed_at))]
            await self._slots.join(keys.packet_slot(packet_id))
            restored = await packet_restore(
                self._packets,
                packet_id,
                [*recorded, *(share_value(seq, share) for seq, share in undrawn), *recipients],
                **recorded_args(row, self._limits.retention_s),
                epoch=epoch,
                version=packet_version(epoch, row.count, len(grabs), "active"),
                grab_count=len(grabs),
            )
        if restored.code is not PacketCode.OK:
            return False
        RESTORED.labels("packet").inc()
        log.warning(
            "packet %s was missing from Redis: rebuilt from SQL (epoch %d, %d recorded grabs "
            "kept, %d cents in %d undrawn shares, %s)",
            packet_id,
            epoch,
            len(grabs),
            sum(shares),
            len(shares),
            restored.status,
        )
        return True

    @staticmethod
    def _undrawn(
        row: PacketRow, commitment: Commitment, grabs: Sequence[GrabRow]
    ) -> list[tuple[int, int]]:
        """(seq, share) of each share a rebuilt packet still holds: the committed shares no
        recorded grab took. A packet sent before commitments has its rest drawn again, after
        the highest recorded seq, as it always was."""
        recorded = [(g.seq, g.amount_cents) for g in grabs]
        if commitment.salt:
            if not holds(commitment.shares, recorded):
                # SQL's grabs are not the committed shares: reconciliation reports it
                # (packet_commitment); the shares no grab took still go out, never redrawn.
                log.error("packet %s: recorded grabs off its committed shares", row.packet_id)
            return commitment.undrawn(seq for seq, _cents in recorded)
        left = row.count - len(grabs)
        left_cents = row.amount_cents - sum(cents for _seq, cents in recorded)
        after = max((seq for seq, _cents in recorded), default=0)
        drawn = split(row.strategy, left_cents, left) if left else []
        return list(enumerate(drawn, after + 1))

    async def _grab_from_record(self, row: PacketRow, user_id: str) -> wire.Grabbed:
        # Redis has let the ended packet go; its SQL record answers.
        async with self._db.sessions() as session:
            grab = await session.get(GrabRow, (row.packet_id, user_id))
        if grab is not None:
            return already_grabbed(grab.amount_cents)
        # The packet's terms refuse as packet_grab's do, before its status.
        if not row.sender_may_grab and user_id == row.sender_id:
            refuse(PacketCode.SENDER_CANNOT_GRAB, row.packet_id)
        if row.recipients_count and user_id not in (await self._sending.contents(row))[1]:
            refuse(PacketCode.NOT_A_RECIPIENT, row.packet_id)
        if row.status == "sold_out":
            refuse(PacketCode.SOLD_OUT, row.packet_id)
        if row.status == "expired":
            refuse(PacketCode.EXPIRED, row.packet_id)
        if row.status == "withdrawn":
            refuse(PacketCode.WITHDRAWN, row.packet_id)
        raise errors.RedisUnavailable(f"packet {row.packet_id!r} is missing from Redis")
