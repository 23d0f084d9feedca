"""How a batch of the packet scripts' outbox records (groupbuy/redpacket/records.py)
becomes SQL rows, ledger entries and events, idempotently: a record applied before
changes nothing.
"""

from __future__ import annotations

from typing import cast

from groupbuy_client.wire import from_ms
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.redpacket.codec import refund_key
from groupbuy.redpacket.grab_batch import (
    CUSTOM_PLANS,
    GrabRows,
    fence_steps,
    grab_batch_steps,
    grab_steps,
)
from groupbuy.redpacket.ledger import post_entry
from groupbuy.redpacket.models import PacketRow
from groupbuy.redpacket.records import GrabRecord, PacketEnding, PacketRecord, packet_event_key
from groupbuy.storage.bulk import Moments, dialect_of
from groupbuy.storage.db import Database
from groupbuy.storage.events import Event, record_event
from groupbuy.storage.steps import run_on_session


async def record_packet_batch(
    database: Database, packet_id: str, records: list[PacketRecord]
) -> str | None:
    """Apply one packet's batch of records in one transaction (the write-behind's); returns
    the packet's status after it. A batch of grabs alone, the bulk of the traffic, has its
    rows built first and runs as steps (groupbuy/redpacket/grab_batch.py)."""
    if all(f["type"] == "grab" for f in records):
        dialect = database.engine.dialect
        moments = Moments(dialect)
        batch = GrabRows.of(cast(list[GrabRecord], records), moments)
        postgresql = dialect.name == "postgresql"
        return await database.run_steps(
            lambda: grab_batch_steps(packet_id, batch, postgresql, moments), records=len(records)
        )
    async with database.transaction() as session:
        await apply_packet_records(session, records)
        return await session.scalar(
            select(PacketRow.status).where(PacketRow.packet_id == packet_id)
        )


async def apply_packet_records(session: AsyncSession, records: list[PacketRecord]) -> None:
    """Apply a batch of packet-script records to SQL; records applied before change nothing.

    Grabs, the bulk of the traffic, go in with one statement per table per batch (grab
    rows, ledger credits, balances); the rare endings are applied one by one after them.
    Records of an epoch the packet has left (Redis lost that state and it was rebuilt from
    SQL since) are fenced out: their grabs are kept as acknowledged grabs to report.
    """
    dialect = await dialect_of(session)
    postgresql, moments = dialect.name == "postgresql", Moments(dialect)
    if postgresql:
        await session.execute(text(CUSTOM_PLANS))
    records = await run_on_session(session, fence_steps(records, postgresql, moments))
    grabs: list[GrabRecord] = []
    endings: list[PacketEnding] = []
    for f in records:
        if f["type"] == "grab":
            grabs.append(f)
        else:
            endings.append(f)
    if grabs:
        await run_on_session(session, grab_steps(GrabRows.of(grabs, moments), postgresql))
    for ending in endings:
        await _apply_ending(session, ending)


async def _apply_ending(session: AsyncSession, f: PacketEnding) -> None:
    kind, packet_id, at_ms = f["type"], f["packet_id"], int(f["at_ms"])
    at = from_ms(at_ms)
    data: dict[str, object] = {"packet_id": packet_id, "sender_id": f["sender_id"]}
    if "version" in f:  # records written before packets had versions carry none
        data["version"] = int(f["version"])
    if f["type"] == "packet.sold_out":
        await _set(session, packet_id, status="sold_out", sold_out_at=at)
        await record_event(session, Event(kind, at_ms, packet_event_key(kind, packet_id), data))
    elif f["type"] == "packet.withdrawn":
        # The status changes with the refund that follows: the packet's last record.
        await _set(session, packet_id, withdrawn_at=at)
        await record_event(session, Event(kind, at_ms, packet_event_key(kind, packet_id), data))
    elif f["type"] == "packet.refunded":
        reason = f.get("reason", "expired")
        refunded = int(f["refunded_cents"])
        await post_entry(
            session,
            user_id=f["sender_id"],
            kind="refund_credit",
            amount_cents=refunded,
            business_key=refund_key(packet_id),
            at=at,
        )
        ended = {"expired_at": at} if reason == "expired" else {}
        await _set(session, packet_id, status=reason, refunded_cents=refunded, **ended)
        data |= {
            "refunded_cents": refunded,
            "ungrabbed_count": int(f["remaining_count"]),
            "reason": reason,
        }
        await record_event(session, Event(kind, at_ms, packet_event_key(kind, packet_id), data))
    else:
        raise ValueError(f"unknown packet record type {kind!r}")


async def _set(session: AsyncSession, packet_id: str, **values: object) -> None:
    await session.execute(
        update(PacketRow).where(PacketRow.packet_id == packet_id).values(**values)
    )
