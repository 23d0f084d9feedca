"""Small helpers the parts of the red-packet engine share: a packet's SQL record and its
grabs."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.redpacket.models import GrabRow, PacketRow
from groupbuy.storage.db import Database


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
