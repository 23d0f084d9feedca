"""Small helpers the parts of the red-packet engine share: a packet's SQL record and its
grabs, and the packet as packet_create writes it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.redpacket.models import GrabRow, PacketRow
from groupbuy.storage.db import Database
from groupbuy.storage.timefmt import to_ms


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


def recorded_args(row: PacketRow, retention_s: int) -> dict[str, Any]:
    """What packet_create and packet_restore write of the packet, as SQL records it."""
    return {
        "sender_id": row.sender_id,
        "amount_cents": row.amount_cents,
        "count": row.count,
        "strategy": row.strategy,
        "created_ms": to_ms(row.created_at),
        "expires_ms": to_ms(row.expires_at),
        "retention_ms": retention_s * 1000,
    }
