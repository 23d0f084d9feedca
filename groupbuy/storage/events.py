"""The durable events feed: one SQL row per thing that happened, read in feed-position order.

A row's `id` is taken when it is inserted; on PostgreSQL, transactions take ids in one order
and commit in another, so a reader that has passed id N could later find a row with an id
below N commit and never see it. The feed therefore serves `position`, given after commit by
one sequencer at a time to the committed rows that have none (`assign_positions`), each
above every position given before: no later commit can land below a cursor a reader holds.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from groupbuy_client.wire import from_ms, iso_ms, to_ms
from sqlalchemy import (
    BigInteger,
    CursorResult,
    DateTime,
    Index,
    Integer,
    String,
    Text,
    false,
    func,
    select,
    text,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, aliased, mapped_column

from groupbuy.storage.bulk import Moments
from groupbuy.storage.db import Base, Database, dialect_insert, insert_ignore, mark_committing
from groupbuy.storage.steps import Steps, inserting

# The on_commit topic of transactions that recorded events (the webhook deliverer listens).
FEED_COMMITTED = "feed"
# Most rows one sequencer transaction positions: bounds a feed read behind a large backlog
# (the next read positions the rest).
POSITION_BATCH = 5000
# The PostgreSQL advisory lock that lets one sequencer run at a time, across every process
# ("gbev" in ASCII; advisory locks are keyed by a number only).
SEQUENCER_LOCK = 0x67626576


class EventRow(Base):
    """One event; `dedup_key` names the fact so that recording it twice is a no-op;
    `position` is its place in the feed, null until the sequencer gives it one."""

    __tablename__ = "events"
    __table_args__ = (
        Index("uq_events_position", "position", unique=True),
        # The rows waiting for a position, and only those: finding none is one index probe.
        Index(
            "ix_events_unpositioned",
            "id",
            postgresql_where=text("position IS NULL"),
            sqlite_where=text("position IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    type: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    dedup_key: Mapped[str] = mapped_column(String(300), unique=True)
    data: Mapped[str] = mapped_column(Text)
    position: Mapped[int | None] = mapped_column(BigInteger, nullable=True, default=None)


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
    mark_committing(session, FEED_COMMITTED)
    return await insert_ignore(session, EventRow.__table__, _row(event))


async def record_events(session: AsyncSession, events: list[Event]) -> None:
    """Insert many events in one statement, skipping those already recorded (ids follow order)."""
    if events:
        mark_committing(session, FEED_COMMITTED)
        # executemany, rows in list order: compiled once, cached (not per batch size).
        statement = dialect_insert(session, EventRow.__table__).on_conflict_do_nothing()
        await session.execute(statement, [_row(e) for e in events])


_NEW_EVENTS = "INSERT INTO events (type, at, dedup_key, data)"


def event_steps(events: list[Event], moments: Moments) -> Steps[None]:
    """`record_events` as steps (groupbuy/storage/steps.py): one statement, the rows in
    list order (ids follow it), those already recorded skipped. The transaction that runs
    them must name FEED_COMMITTED among its topics (Database.run_steps)."""
    rows = [
        (e.type, moments(str(e.at_ms)), e.dedup_key, json.dumps(e.data, separators=(",", ":")))
        for e in events
    ]
    yield from inserting(_NEW_EVENTS, rows, " ON CONFLICT DO NOTHING")


async def assign_positions(database: Database, limit: int = POSITION_BATCH) -> int:
    """Give feed positions to up to `limit` committed events that have none, in id order,
    above the highest position given so far; returns how many it gave.

    One sequencer at a time (PostgreSQL: an advisory lock held to the commit; SQLite: its
    single writer), and the highest position is read under that exclusion, after the
    previous sequencer's commit: a position once seen is never given again, nor one below
    it. Rows still uncommitted are invisible here and get their positions on a later run.
    """
    async with database.sessions() as session:
        if not await _waiting(session):
            return 0
    return await _sequence(database, limit)


# Statements every delivery pass runs, built once: building one anew cost more of the
# loop's CPU than running it (the numbering's most, with its aliases).
_WAITING = select(EventRow.id).where(EventRow.position.is_(None)).limit(1)
# A write that changes nothing still takes SQLite's write lock.
_TAKE_WRITE_LOCK = update(EventRow).where(false()).values(position=EventRow.position)


async def _waiting(session: AsyncSession) -> bool:
    # One probe of the partial index on the unpositioned rows; takes no lock.
    return await session.scalar(_WAITING) is not None


async def _sequence(database: Database, limit: int, urgent: bool = False) -> int:
    async with database.transaction(urgent) as session:
        if not database.is_sqlite:
            await session.execute(select(func.pg_advisory_xact_lock(SEQUENCER_LOCK)))
        return await _number(session, limit)


async def sequence_in(session: AsyncSession, is_sqlite: bool, limit: int = POSITION_BATCH) -> int:
    """assign_positions inside the caller's transaction, whose commit ends the sequencer's
    exclusion: on PostgreSQL the advisory lock, on SQLite the write lock, which this takes
    first whatever waits (before any read: a read transaction that later writes fails at
    once if another process wrote since its reads). Rows waiting are probed first, so the
    numbering statement runs only when some do."""
    if is_sqlite:
        # Far cheaper than numbering.
        await session.execute(_TAKE_WRITE_LOCK)
    if not await _waiting(session):
        return 0
    if not is_sqlite:
        await session.execute(select(func.pg_advisory_xact_lock(SEQUENCER_LOCK)))
    return await _number(session, limit)


async def _number(session: AsyncSession, limit: int) -> int:
    # One statement: on SQLite it takes the write lock before it reads, so the highest
    # position it reads cannot change under it (another process's sequencer waits).
    result = await session.execute(_numbering(limit))
    return int(cast(CursorResult[Any], result).rowcount)


@functools.lru_cache(maxsize=8)
def _numbering(limit: int) -> Any:
    """The UPDATE that gives positions to up to `limit` rows (built once per limit)."""
    given = aliased(EventRow)
    top = select(func.coalesce(func.max(given.position), 0)).scalar_subquery()
    unpositioned = aliased(EventRow)
    numbered = (
        select(
            unpositioned.id.label("id"),
            (top + func.row_number().over(order_by=unpositioned.id)).label("position"),
        )
        .where(unpositioned.position.is_(None))
        .order_by(unpositioned.id)
        .limit(limit)
        .subquery()
    )
    return (
        update(EventRow)
        .where(EventRow.id == numbered.c.id)
        .values(position=numbered.c.position)
        .execution_options(synchronize_session=False)
    )


async def read_events(session: AsyncSession, after: int, limit: int) -> dict[str, Any]:
    """The feed page after position `after` (rows positioned so far):
    `{"events": [...], "next_after": position}`; an event's `id` is its position."""
    rows = (
        await session.scalars(
            select(EventRow)
            .where(EventRow.position > after)
            .order_by(EventRow.position)
            .limit(limit)
        )
    ).all()
    events = [
        {
            "id": row.position,
            "type": row.type,
            "at": iso_ms(to_ms(row.at)),
            "data": json.loads(row.data),
        }
        for row in rows
    ]
    return {"events": events, "next_after": events[-1]["id"] if events else after}


async def read_feed(database: Database, after: int, limit: int) -> dict[str, Any]:
    """The page GET /v1/events serves: positions given to everything committed so far, then
    the page after `after` (so an event committed before the call is on it or a later one).
    With nothing waiting for a position, that is one connection and two short queries."""
    async with database.sessions() as session:
        if not await _waiting(session):
            return await read_events(session, after, limit)
    # The probe's connection is back in the pool before the sequencer takes one: a burst of
    # reads never holds two connections each. The reader's answer waits on it: urgent.
    await _sequence(database, POSITION_BATCH, urgent=True)
    async with database.sessions() as session:
        return await read_events(session, after, limit)
