"""The withdrawal, whole: the sender takes back what is left of an active packet
(packet_withdraw: its spec and call are here).

The packet ends `withdrawn` in one script, which records the refund the way an expiry
does (one `packet.refunded` record, its ledger key unique to the packet): whichever of
the two comes first ends the packet, and the refund is paid exactly once.
"""

from __future__ import annotations

from groupbuy_client import wire

from groupbuy import errors
from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.read import LostPacket, ReadService, recorded_packet
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
from groupbuy.redpacket.writer import PacketRecordWriter
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.specs import ScriptSpec, shape, slots

PACKET_WITHDRAW = ScriptSpec(
    "packet_withdraw",
    "The sender takes back what is left of an active packet, exactly once.",
    keys=PACKET_KEYS,
    args=(*PACKET_ARGV, *slots(("sender_id", "who asks: only the packet's sender may"))),
    replies={
        OK: shape("withdrawn now, its refund recorded", ("refunded_cents", int)),
        EXISTING: shape("withdrawn before (nothing changed)", ("refunded_cents", int)),
        PacketCode.NOT_THE_SENDER: shape("someone else sent the packet"),
        PacketCode.PACKET_ENDED: shape("it had ended: sold_out or expired", ("status", str)),
        PACKET_NOT_FOUND: NO_PACKET,
    },
)


async def packet_withdraw(packets: PacketScripts, packet_id: str, sender_id: str) -> PacketReply:
    """packet_withdraw."""
    return await packets.run(PACKET_WITHDRAW, packet_id, sender_id=sender_id)


class WithdrawService(UsesBackends):
    """Withdrawals: the rest of an active packet back to its sender, once."""

    def __init__(
        self,
        backends: Backends,
        scripts: PacketScripts,
        lost: LostPacket,
        writer: PacketRecordWriter,
        reads: ReadService,
    ) -> None:
        super().__init__(backends)
        self._packets = scripts
        self._lost = lost
        self._writer = writer
        self._reads = reads

    async def withdraw(self, packet_id: str, sender_id: str) -> wire.Packet:
        """End the packet `withdrawn` and refund its rest; a repeat answers the same packet.

        Another sender: 403 `not_the_sender`; sold out or expired: 409 `packet_ended`."""
        reply = await packet_withdraw(self._packets, packet_id, sender_id)
        if reply.code is PacketCode.PACKET_NOT_FOUND:
            row = await recorded_packet(self._db, packet_id)
            if row.sender_id != sender_id:
                reply = PACKET_WITHDRAW.parse([PacketCode.NOT_THE_SENDER])
            elif await self._lost.bring_back(row):
                reply = await packet_withdraw(self._packets, packet_id, sender_id)
            elif row.status == "withdrawn":
                reply = PACKET_WITHDRAW.parse([EXISTING, row.refunded_cents])
            else:
                reply = PACKET_WITHDRAW.parse([PacketCode.PACKET_ENDED, row.status])
        if reply.code is PacketCode.NOT_THE_SENDER:
            raise errors.NotTheSender(
                f"packet {packet_id!r} was not sent by {sender_id!r}", sender_id=sender_id
            )
        if reply.code is PacketCode.PACKET_ENDED:
            raise errors.PacketEnded(
                f"packet {packet_id!r} has ended: {reply.status}", packet_status=reply.status
            )
        if reply.code is PacketCode.PACKET_NOT_FOUND:
            raise errors.RedisUnavailable(f"packet {packet_id!r} is missing from Redis")
        # The refund reaches SQL before the answer, as an expiry's does in its sweep.
        await self._writer.drain(packet_id)
        return await self._reads.get(packet_id)
