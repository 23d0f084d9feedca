"""ListingService: pages of packets, newest first (GET /v1/redpackets).

Each page is one SQL statement over an index (keyset cursors, never OFFSET), then the live
fields of the page's packets from Redis in one pipelined batch (never SCAN or KEYS).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from groupbuy_client.wire import from_ms, to_ms
from sqlalchemy import and_, func, or_, select

from groupbuy.redpacket.models import GrabRow, PacketEpochRow, PacketRow
from groupbuy.redpacket.read import packet_version
from groupbuy.redpacket.send import sent_body
from groupbuy.storage.backends import UsesBackends

# A packet's status as the API names it -> the SQL statuses it covers (a `pending` packet
# is sent and being put in Redis: the API already shows it active).
SQL_STATUSES = {
    "active": ("pending", "active"),
    "sold_out": ("sold_out",),
    "expired": ("expired",),
    "withdrawn": ("withdrawn",),
}
# What a page reads of each packet's Redis hash.
_LIVE_FIELDS = ("status", "remaining_count", "remaining_cents", "refunded", "version")


def packet_cursor(row: PacketRow) -> str:
    """The cursor after `row`: `<created_at ms>.<packet_id>`."""
    return f"{to_ms(row.created_at)}.{row.packet_id}"


class ListingService(UsesBackends):
    """Pages of packets, each bounded by its limit."""

    async def packets(
        self,
        limit: int,
        cursor: str | None = None,
        sender_id: str | None = None,
        status: str | None = None,
    ) -> dict[str, Any]:
        """Packets newest first (by created_at, then packet_id), of one sender and/or of one
        status, after `cursor` (the previous page's `next_cursor`); bodies as GET one
        answers them, without `grabs` and `luckiest_user_id`."""
        query = select(PacketRow).order_by(PacketRow.created_at.desc(), PacketRow.packet_id.desc())
        if sender_id is not None:
            query = query.where(PacketRow.sender_id == sender_id)
        if cursor:
            created_ms, _dot, last_id = cursor.partition(".")
            created = from_ms(int(created_ms))
            query = query.where(
                or_(
                    PacketRow.created_at < created,
                    and_(PacketRow.created_at == created, PacketRow.packet_id < last_id),
                )
            )
        # One statement per SQL status, each a range of its (status, created_at, packet_id)
        # index: `status IN (...)` would read every row of those statuses to sort them.
        queries = (
            [query]
            if status is None
            else [
                query.where(PacketRow.status == sql_status) for sql_status in SQL_STATUSES[status]
            ]
        )
        rows: list[PacketRow] = []
        async with self._db.sessions() as session:
            for each in queries:
                rows += (await session.scalars(each.limit(limit + 1))).all()
        rows.sort(key=lambda row: (to_ms(row.created_at), row.packet_id), reverse=True)
        more = len(rows) > limit
        rows = rows[:limit]
        bodies = await self._bodies(rows)
        if status is not None:
            # SQL learns an ending from the write-behind a moment after Redis: a packet whose
            # live state has moved on leaves this status's page (the page may be shorter).
            bodies = [body for body in bodies if body["status"] == status]
        return {"packets": bodies, "next_cursor": packet_cursor(rows[-1]) if more else None}

    async def _bodies(self, rows: Sequence[PacketRow]) -> list[dict[str, Any]]:
        live = await self._live(rows)
        recorded = await self._recorded([row for row in rows if row.packet_id not in live])
        bodies = []
        for row in rows:
            body = sent_body(row) | {
                "refunded_cents": row.refunded_cents,
                "recipients_count": row.recipients_count,
                "password_protected": row.password_hash is not None,
            }
            body |= live.get(row.packet_id) or recorded[row.packet_id]
            bodies.append(body)
        return bodies

    async def _live(self, rows: Sequence[PacketRow]) -> dict[str, dict[str, Any]]:
        """The live fields of the packets Redis holds, in one pipelined batch."""
        if not rows:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for row in rows:
                pipe.hmget(self._keys.packet_keys(row.packet_id).hash, *_LIVE_FIELDS)
            replies = await pipe.execute()
        live = {}
        for row, values in zip(rows, replies, strict=True):
            status, remaining_count, remaining_cents, refunded, version = values
            if status is None:
                continue  # Redis let it go (ended and released) or lost it: SQL answers
            live[row.packet_id] = {
                "status": str(status),
                "remaining_count": int(remaining_count),
                "remaining_cents": int(remaining_cents),
                "refunded_cents": int(refunded or 0),
                "version": int(version or 0),
            }
        return live

    async def _recorded(self, rows: Sequence[PacketRow]) -> dict[str, dict[str, Any]]:
        """The live fields of the page's packets Redis does not hold, from their grab rows:
        one grouped statement over the grabs' primary key, one over the epochs (the page's
        rows are at hand: reading them again would read the page twice)."""
        if not rows:
            return {}
        packet_ids = [row.packet_id for row in rows]
        async with self._db.sessions() as session:
            totals = {
                packet_id: (int(grabs), int(cents or 0))
                for packet_id, grabs, cents in (
                    await session.execute(
                        select(GrabRow.packet_id, func.count(), func.sum(GrabRow.amount_cents))
                        .where(GrabRow.packet_id.in_(packet_ids))
                        .group_by(GrabRow.packet_id)
                    )
                ).all()
            }
            epochs = dict(
                (
                    await session.execute(
                        select(PacketEpochRow.packet_id, PacketEpochRow.epoch).where(
                            PacketEpochRow.packet_id.in_(packet_ids)
                        )
                    )
                ).all()
            )
        found = {}
        for row in rows:
            packet_id = row.packet_id
            grabs, cents = totals.get(packet_id, (0, 0))
            found[packet_id] = {
                "remaining_count": row.count - grabs,
                "remaining_cents": row.amount_cents - cents,
                "version": packet_version(epochs.get(packet_id, 0), row.count, grabs, row.status),
            }
        return found
