"""The read of one packet, whole: the packet with its grabs, live from Redis (packet_read)
or from SQL once Redis let it go.

Its script's spec and call, the operation (`ReadService`) and its answer: `PacketView`,
one shape for a packet whichever store it is read from, and its API body. The SQL side
(`recorded_packet`, `recorded_grabs`, `packet_version`) serves the recovery and the
listing too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors, wire
from groupbuy.redpacket.codec import parse_grab
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.models import GrabRow, PacketEpochRow, PacketRow
from groupbuy.redpacket.specs import (
    NO_PACKET,
    OK,
    PACKET_ARGV,
    PACKET_KEYS,
    PACKET_NOT_FOUND,
    PacketReply,
    PacketScripts,
)
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.db import Database
from groupbuy.storage.specs import ScriptSpec, reply_dict, shape
from groupbuy.wire import iso_ms, to_ms

PACKET_READ = ScriptSpec(
    "packet_read",
    "A packet's state and grabs after the lazy expiry check.",
    keys=PACKET_KEYS,
    args=PACKET_ARGV,
    replies={
        OK: shape(
            "the packet hash and its grabs hash (user -> grab value) at now_ms",
            ("packet", reply_dict),
            ("grabs", reply_dict),
            ("now_ms", int),
        ),
        PACKET_NOT_FOUND: NO_PACKET,
    },
)


async def packet_read(packets: PacketScripts, packet_id: str) -> PacketReply:
    """packet_read."""
    return await packets.run(PACKET_READ, packet_id)


class LostPacket(Protocol):
    """What a read does when Redis does not hold a packet SQL says is live
    (RecoveryService does it)."""

    async def bring_back(self, row: PacketRow) -> bool:
        """Put the packet back in Redis; False when its SQL record is the answer."""


class ReadService(UsesBackends):
    """Reads of one packet, in one shape whichever store answers."""

    def __init__(self, backends: Backends, scripts: PacketScripts, lost: LostPacket) -> None:
        super().__init__(backends)
        self._packets = scripts
        self._lost = lost

    async def get(self, packet_id: str) -> wire.Packet:
        """A packet with its grabs: live from Redis, or from SQL once Redis let it go."""
        reading = await packet_read(self._packets, packet_id)
        if reading.code is PacketCode.PACKET_NOT_FOUND:
            row = await recorded_packet(self._db, packet_id)
            if await self._lost.bring_back(row):
                reading = await packet_read(self._packets, packet_id)
        if reading.code is PacketCode.OK:
            return PacketView.from_redis(packet_id, reading.packet, reading.grabs).body()
        row = await recorded_packet(self._db, packet_id)
        async with self._db.sessions() as session:
            rows = await recorded_grabs(session, packet_id)
            mark = await session.get(PacketEpochRow, packet_id)
        return PacketView.from_rows(row, rows, mark.epoch if mark else 0).body()


async def recorded_packet(db: Database, packet_id: str) -> PacketRow:
    """The packet's SQL row; PacketNotFound when SQL never recorded it."""
    async with db.sessions() as session:
        row = await session.get(PacketRow, packet_id)
    if row is None:
        raise errors.PacketNotFound(f"no packet {packet_id!r}")
    return row


async def recorded_grabs(session: AsyncSession, packet_id: str) -> Sequence[GrabRow]:
    """A packet's grab rows in seq order."""
    query = select(GrabRow).where(GrabRow.packet_id == packet_id).order_by(GrabRow.seq)
    return (await session.scalars(query)).all()


def packet_version(epoch: int, count: int, grabs: int, ended: bool) -> int:
    """A packet's version from what SQL knows: 1 when sent, +1 per grab, +1 when it ended.

    Each rebuild after Redis lost the packet (epoch e) starts above anything the lost state
    can have reached (at most count + 2 changes per epoch), so versions only grow.
    """
    return epoch * (count + 3) + 1 + grabs + int(ended)


@dataclass(frozen=True)
class PacketView:
    """A packet as either store holds it (Redis live, SQL once ended), in one shape."""

    packet_id: str
    sender_id: str
    amount_cents: int
    count: int
    strategy: str
    status: str  # active | sold_out | expired
    expires_ms: int
    refunded_cents: int
    grabs: list[tuple[str, int, int]]  # (user, amount_cents, grabbed_at_ms), grab order
    version: int  # the packet's changes so far (SPEC §3); a newer body has a larger one

    @classmethod
    def from_redis(
        cls, packet_id: str, packet: dict[str, str], grabs: dict[str, str]
    ) -> PacketView:
        """From a packet_read reply: the packet hash and the grabs hash (user -> grab value)."""
        ordered = sorted(
            ((parse_grab(value), user) for user, value in grabs.items()),
            key=lambda item: item[0].seq,
        )
        return cls(
            packet_id=packet_id,
            sender_id=packet["sender_id"],
            amount_cents=int(packet["amount"]),
            count=int(packet["count"]),
            strategy=packet["strategy"],
            status=packet["status"],
            expires_ms=int(packet["expires_ms"]),
            refunded_cents=int(packet.get("refunded", 0)),
            grabs=[(user, grab.amount_cents, grab.at_ms) for grab, user in ordered],
            version=int(packet.get("version", 0)),
        )

    @classmethod
    def from_rows(cls, packet: PacketRow, grabs: Sequence[GrabRow], epoch: int) -> PacketView:
        """From the SQL record of a packet Redis no longer holds; grabs in seq order, `epoch`
        how often Redis lost it and it was rebuilt."""
        ended = packet.status in ("sold_out", "expired")
        return cls(
            packet_id=packet.packet_id,
            sender_id=packet.sender_id,
            amount_cents=packet.amount_cents,
            count=packet.count,
            strategy=packet.strategy,
            status="active" if packet.status == "pending" else packet.status,
            expires_ms=to_ms(packet.expires_at),
            refunded_cents=packet.refunded_cents,
            grabs=[(g.user_id, g.amount_cents, to_ms(g.grabbed_at)) for g in grabs],
            version=packet_version(epoch, packet.count, len(grabs), ended),
        )

    def body(self) -> wire.Packet:
        """The API's packet JSON (SPEC §3: luckiest_user_id once sold out, ties to the earlier)."""
        grabbed = sum(amount_cents for _user, amount_cents, _at in self.grabs)
        luckiest = None
        if self.status == "sold_out" and self.grabs:
            # max() keeps the first of equals: ties go to the earlier grab
            luckiest = max(self.grabs, key=lambda grab: grab[1])[0]
        return {
            "packet_id": self.packet_id,
            "sender_id": self.sender_id,
            "amount_cents": self.amount_cents,
            "count": self.count,
            "strategy": cast(wire.SplitStrategy, self.strategy),
            "status": cast(wire.PacketStatus, self.status),
            "remaining_count": self.count - len(self.grabs),
            "remaining_cents": self.amount_cents - grabbed,
            "refunded_cents": self.refunded_cents,
            "expires_at": iso_ms(self.expires_ms),
            "grabs": [
                {"user_id": user, "amount_cents": amount_cents, "grabbed_at": iso_ms(at)}
                for user, amount_cents, at in self.grabs
            ],
            "luckiest_user_id": luckiest,
            "version": self.version,
        }
