"""The durable events feed: one SQL row per thing that happened, read in id order."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Integer, String, Text, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from groupbuy.storage.db import Base, dialect_insert, insert_ignore
from groupbuy.storage.timefmt import from_ms, iso_ms, to_ms


class EventRow(Base):
    """One event; `dedup_key` names the fact so that recording it twice is a no-op."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    type: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    dedup_key: Mapped[str] = mapped_column(String(300), unique=True)
    data: Mapped[str] = mapped_column(Text)


@dataclass(frozen=True)
class Event:
    """An event to record: its type, when it happened, its identity and its payload."""

    type: str
    at_ms: int
    dedup_key: str
    data: dict[str, Any]


def _row(event: Event) -> dict[str, Any]:
    return {
        "type": event.type,
        "at": from_ms(event.at_ms),
        "dedup_key": event.dedup_key,
        "data": json.dumps(event.data, separators=(",", ":")),
    }


async def record_event(session: AsyncSession, event: Event) -> bool:
    """Insert the event unless already recorded; True if this call recorded it."""
    return await insert_ignore(session, EventRow.__table__, _row(event))


async def record_events(session: AsyncSession, events: list[Event]) -> None:
    """Insert many events in one statement, skipping those already recorded (ids follow order)."""
    if events:
        # executemany, rows in list order: compiled once, cached (not per batch size).
        statement = dialect_insert(session, EventRow.__table__).on_conflict_do_nothing()
        await session.execute(statement, [_row(e) for e in events])


async def read_events(session: AsyncSession, after: int, limit: int) -> dict[str, Any]:
    """The feed page after id `after`: `{"events": [...], "next_after": id}`."""
    rows = (
        await session.scalars(
            select(EventRow).where(EventRow.id > after).order_by(EventRow.id).limit(limit)
        )
    ).all()
    events = [
        {"id": row.id, "type": row.type, "at": iso_ms(to_ms(row.at)), "data": json.loads(row.data)}
        for row in rows
    ]
    return {"events": events, "next_after": rows[-1].id if rows else after}
