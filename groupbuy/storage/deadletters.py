"""Dead letters: outbox records SQL can never apply, kept apart instead of blocking the rest.

A write-behind batch that fails is split in halves, each applied in its own transaction,
down to the single record that fails on its own (a poison record: malformed fields, an
unknown type, a value the SQL insert refuses). That record is written to the SQL table
`dead_letters` (durable, never pruned) and only then moved, atomically, from its outbox
to the dead-letter stream (`lua/outbox_bury.lua`); every other record of the batch is
applied. A failure that says nothing about the record itself (SQL down or locked, a
lost connection, Redis away) is transient: it is raised as before and the batch waits,
whole, for the next round, so a backlog drains once SQL is back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from groupbuy_client.wire import from_ms, iso_ms, to_ms
from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    String,
    Text,
    UniqueConstraint,
    func,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from groupbuy import errors, metrics
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.calls import outbox_bury
from groupbuy.storage.db import Base, causes, dialect_insert, sqlstate, unavailable

log = logging.getLogger(__name__)

StreamKind = Literal["packets", "teams"]
Entries = list[tuple[str, dict[str, str]]]
# How a stream's records are applied to SQL inside a session (what its writer does).
Applier = Callable[[AsyncSession, list[dict[str, str]]], Awaitable[None]]

# The dead-letter stream in Redis keeps about this many of the newest letters (XADD MAXLEN
# ~): a window for redis-cli and stream readers. The SQL table keeps every one.
STREAM_CAP = 10_000
# The longest error text kept (a driver's message can quote a whole statement).
_ERROR_CHARS = 2000
# PostgreSQL advisory lock that makes dead letters commit one writer at a time ("gbdl").
KEEPER_LOCK = 0x6762646C

# Errors a record brings on itself: the same record fails the same way every time.
_POISON_ERRORS: tuple[type[BaseException], ...] = (
    KeyError,
    ValueError,
    TypeError,
    IndexError,
    OverflowError,
    sa_exc.IntegrityError,
    sa_exc.DataError,
)

_POISON_SQLSTATE_CLASSES = ("22", "23")


class DeadLetterRow(Base):
    """One outbox record SQL could not apply: where it was, what it held, and why."""

    __tablename__ = "dead_letters"
    __table_args__ = (UniqueConstraint("stream", "owner_id", "entry_id"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    stream: Mapped[str] = mapped_column(String(16))
    owner_id: Mapped[str] = mapped_column(String(64))
    entry_id: Mapped[str] = mapped_column(String(64))
    record_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    user_id: Mapped[str | None] = mapped_column(String(300), nullable=True, index=True)
    fields: Mapped[str] = mapped_column(Text)
    error: Mapped[str] = mapped_column(Text)
    dead_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Set once an operator replayed it and SQL took it (the row stays, as the record).
    replayed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


@dataclass(frozen=True)
class Poison:
    """A record that failed on its own, with the error it raised."""

    entry_id: str
    fields: dict[str, str]
    error: str


def is_poison(exc: BaseException) -> bool:
    """Whether an error is the record's own fault (dead-letter it) rather than transient
    (SQL down or locked, a lost connection: retry the batch later). The database being
    unavailable is judged by `groupbuy.storage.db.unavailable`, as the API's 503 is."""
    if unavailable(exc):
        return False  # the database or the connection, not the record
    if isinstance(exc, sa_exc.DBAPIError):
        if isinstance(exc, (sa_exc.IntegrityError, sa_exc.DataError)):
            return True
        # asyncpg's errors arrive as a plain DBAPIError: one refusing a parameter before
        # sending it ("invalid input for query argument") is a ValueError, and the server's
        # carry their SQLSTATE (class 22: data exception, 23: integrity constraint).
        return any(
            isinstance(cause, _POISON_ERRORS) or sqlstate(cause)[:2] in _POISON_SQLSTATE_CLASSES
            for cause in causes(exc.orig)
        )
    if isinstance(exc, sa_exc.StatementError):  # a bind parameter's conversion failed
        return exc.orig is not None and is_poison(exc.orig)
    return isinstance(exc, _POISON_ERRORS)


def describe(exc: BaseException) -> str:
    """The error text kept with a dead letter: its type and message, bounded."""
    return f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]


async def apply_isolating(
    entries: Entries, apply: Callable[[Entries], Awaitable[None]]
) -> list[Poison]:
    """Apply `entries` with `apply` (one transaction per call); when that fails with a
    poison error, apply each half on its own, down to the single records that fail alone.

    Returns those records; every other entry has been applied (in stream order). A
    transient error propagates at once: what was applied stays applied (records are
    idempotent), the rest is read again next round.
    """
    try:
        await apply(entries)
    except Exception as exc:
        if not is_poison(exc):
            raise
        if len(entries) == 1:
            entry_id, fields = entries[0]
            return [Poison(entry_id, fields, describe(exc))]
    else:
        return []
    middle = len(entries) // 2
    poisoned = await apply_isolating(entries[:middle], apply)
    return poisoned + await apply_isolating(entries[middle:], apply)


class DeadLetters(UsesBackends):
    """Writes dead letters (SQL row first, then the atomic move in Redis) and reads them."""

    def __init__(self, backends: Backends) -> None:
        super().__init__(backends)
        self._appliers: dict[str, Applier] = {}

    def register(self, kind: StreamKind, apply: Applier) -> None:
        """How records of this stream are applied (each writer registers its own), so that
        a dead letter can be replayed once its cause is fixed."""
        self._appliers[kind] = apply

    async def bury(
        self,
        kind: StreamKind,
        owner_id: str,
        stream: str,
        index: str,
        group: str,
        poisoned: list[Poison],
    ) -> int:
        """Keep these records as dead letters and take them out of their outbox; returns
        how many entries are left in the outbox."""
        entries: list[tuple[str, str]] = []
        dead_at = from_ms(await self._clock.now_ms(self._redis))
        async with self._db.transaction() as session:
            row_ids = await self.keep(session, kind, owner_id, poisoned, dead_at)
        for p in poisoned:
            entries.append((p.entry_id, str(row_ids[p.entry_id])))
        moved = await outbox_bury(
            self._scripts,
            stream,
            index,
            # the dead-letter stream of the outbox's slot in Redis Cluster, so one slot
            self._keys.dead_letters(self._keys.slot_of(stream)),
            group=group,
            member=owner_id,
            kind=kind,
            cap=STREAM_CAP,
            entries=entries,
        )
        buried, left = moved.done, moved.left
        # Counted when the entry leaves its outbox: a retry after a crash between the SQL
        # row and this move finds the row already there and counts the move once.
        metrics.DEAD_LETTERS.labels(stream=kind).inc(int(buried))
        for p in poisoned:
            log.error(
                "outbox record %s of %s %s could not be applied and was moved to the dead "
                "letters: %s",
                p.entry_id,
                kind,
                owner_id,
                p.error,
            )
        return int(left)

    async def keep(
        self,
        session: AsyncSession,
        kind: StreamKind,
        owner_id: str,
        poisoned: list[Poison],
        dead_at: datetime,
    ) -> dict[str, int]:
        """Insert the rows of these records in the caller's transaction (once: a retry finds
        them); returns their ids by entry id.

        On PostgreSQL the transaction first takes KEEPER_LOCK, held to its commit: ids come
        from a sequence when inserted, and two writers (replicas) could otherwise commit
        them out of order, a pager that had read past the higher one never seeing the lower
        one. In turn, every id is committed before a higher one is given. (SQLite has one
        writer at a time already.)
        """
        if not self._db.is_sqlite:
            await session.execute(select(func.pg_advisory_xact_lock(KEEPER_LOCK)))
        await session.execute(
            dialect_insert(session, DeadLetterRow.__table__).on_conflict_do_nothing(),
            [_row(kind, owner_id, p, dead_at) for p in poisoned],
        )
        rows = await session.execute(
            select(DeadLetterRow.entry_id, DeadLetterRow.id).where(
                DeadLetterRow.stream == kind,
                DeadLetterRow.owner_id == owner_id,
                DeadLetterRow.entry_id.in_([p.entry_id for p in poisoned]),
            )
        )
        return {entry_id: row_id for entry_id, row_id in rows}

    async def replay(self, dead_letter_id: int) -> dict[str, Any]:
        """Apply a dead letter's record to SQL now, as its writer would have (records are
        idempotent: replaying twice changes nothing), and note when; the row stays.
        NotFound for an unknown id; ReplayFailed (nothing applied) when it fails again."""
        async with self._db.sessions() as session:
            row = await session.get(DeadLetterRow, dead_letter_id)
        if row is None:
            raise errors.NotFound(f"no dead letter has the id {dead_letter_id}")
        fields = json.loads(row.fields)
        replayed_at = from_ms(await self._clock.now_ms(self._redis))
        try:
            async with self._db.transaction(urgent=True) as session:
                await self._appliers[row.stream](session, [fields])
                stored = await session.get(DeadLetterRow, dead_letter_id)
                assert stored is not None
                stored.replayed_at = stored.replayed_at or replayed_at
                row = stored
        except Exception as exc:
            if not is_poison(exc):
                raise  # SQL down or locked: a 503, try again later
            raise errors.ReplayFailed(
                f"the record still cannot be applied: {describe(exc)}", error=describe(exc)
            ) from exc
        log.warning(
            "dead letter %d (%s %s, entry %s) replayed into SQL",
            row.id,
            row.stream,
            row.owner_id,
            row.entry_id,
        )
        return _answer(row)

    async def page(self, limit: int, cursor: str | None = None) -> dict[str, Any]:
        """Dead letters oldest first, after `cursor` (the `next_cursor` of the page before):
        `{"dead_letters": [...], "next_cursor"}`. Ids commit in order (see `keep`), so a
        pager that goes on from the last id it saw never misses a letter."""
        after = int(cursor) if cursor else 0
        async with self._db.sessions() as session:
            rows = (
                await session.scalars(
                    select(DeadLetterRow)
                    .where(DeadLetterRow.id > after)
                    .order_by(DeadLetterRow.id)
                    .limit(limit + 1)
                )
            ).all()
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "dead_letters": [_answer(row) for row in rows],
            "next_cursor": str(rows[-1].id) if more else None,
        }


def _row(kind: StreamKind, owner_id: str, p: Poison, dead_at: datetime) -> dict[str, Any]:
    return {
        "stream": kind,
        "owner_id": owner_id,
        "entry_id": p.entry_id,
        "record_type": p.fields.get("type", "")[:64] or None,
        "user_id": p.fields.get("user_id", "")[:300] or None,
        "fields": json.dumps(p.fields, separators=(",", ":"), sort_keys=True),
        "error": p.error,
        "dead_at": dead_at,
    }


def _answer(row: DeadLetterRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "stream": row.stream,
        "owner_id": row.owner_id,
        "entry_id": row.entry_id,
        "fields": json.loads(row.fields),
        "error": row.error,
        "dead_at": iso_ms(to_ms(row.dead_at)),
        "replayed_at": None if row.replayed_at is None else iso_ms(to_ms(row.replayed_at)),
    }
