"""How a packet's outbox records become SQL rows, ledger entries and events (idempotently)."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.db import insert_ignore
from groupbuy.events import Event, record_event
from groupbuy.redpacket.ledger import post_entry
from groupbuy.redpacket.models import GrabRow, PacketRow
from groupbuy.timefmt import from_ms


async def apply_packet_record(session: AsyncSession, f: dict[str, str]) -> None:
    """Apply one record of a packet script to SQL; a record applied before changes nothing."""
    kind, packet_id, at_ms = f["type"], f["packet_id"], int(f["at_ms"])
    at = from_ms(at_ms)
    if kind == "grab":
        user_id, amount = f["user_id"], int(f["amount_cents"])
        await insert_ignore(
            session,
            GrabRow.__table__,
            {
                "packet_id": packet_id,
                "user_id": user_id,
                "seq": int(f["seq"]),
                "amount_cents": amount,
                "grabbed_at": at,
            },
        )
        await post_entry(
            session,
            user_id=user_id,
            kind="grab_credit",
            amount_cents=amount,
            business_key=f"grab:{packet_id}:{user_id}",
            at=at,
        )
    elif kind == "packet.sold_out":
        await _set(session, packet_id, status="sold_out", sold_out_at=at)
        await record_event(
            session,
            Event(
                kind,
                at_ms,
                f"{kind}:{packet_id}",
                {"packet_id": packet_id, "sender_id": f["sender_id"]},
            ),
        )
    elif kind == "packet.refunded":
        refunded = int(f["refunded_cents"])
        await post_entry(
            session,
            user_id=f["sender_id"],
            kind="refund_credit",
            amount_cents=refunded,
            business_key=f"refund:{packet_id}",
            at=at,
        )
        await _set(session, packet_id, status="expired", expired_at=at, refunded_cents=refunded)
        data = {
            "packet_id": packet_id,
            "sender_id": f["sender_id"],
            "refunded_cents": refunded,
            "ungrabbed_count": int(f["remaining_count"]),
        }
        await record_event(session, Event(kind, at_ms, f"{kind}:{packet_id}", data))
    else:
        raise ValueError(f"unknown packet record type {kind!r}")


async def _set(session: AsyncSession, packet_id: str, **values: object) -> None:
    await session.execute(
        update(PacketRow).where(PacketRow.packet_id == packet_id).values(**values)
    )
