"""ReadService: a packet with its grabs, live from Redis or from SQL once Redis let it go."""

from __future__ import annotations

from typing import Any

from groupbuy.redpacket.codes import PacketCode
from groupbuy.redpacket.common import recorded_grabs, recorded_packet
from groupbuy.redpacket.models import PacketEpochRow
from groupbuy.redpacket.recovery import RecoveryService
from groupbuy.redpacket.specs import PacketScripts
from groupbuy.redpacket.view import PacketView
from groupbuy.storage.backends import Backends, UsesBackends


class ReadService(UsesBackends):
    """Reads of one packet, in one shape whichever store answers."""

    def __init__(
        self, backends: Backends, scripts: PacketScripts, recovery: RecoveryService
    ) -> None:
        super().__init__(backends)
        self._packets = scripts
        self._recovery = recovery

    async def get(self, packet_id: str) -> dict[str, Any]:
        """A packet with its grabs: live from Redis, or from SQL once Redis let it go."""
        reading = await self._packets.read(packet_id)
        if reading.code is PacketCode.PACKET_NOT_FOUND:
            row = await recorded_packet(self._db, packet_id)
            if await self._recovery.bring_back(row):
                reading = await self._packets.read(packet_id)
        if reading.code is PacketCode.OK:
            return PacketView.from_redis(packet_id, reading.packet, reading.grabs).body()
        row = await recorded_packet(self._db, packet_id)
        async with self._db.sessions() as session:
            rows = await recorded_grabs(session, packet_id)
            mark = await session.get(PacketEpochRow, packet_id)
        return PacketView.from_rows(row, rows, mark.epoch if mark else 0).body()
