"""The audit log: who changed what, why and when, kept in SQL and read a page at a time.

Every action an operator takes (in the console or through an admin route) is one row.
`actor` names the API key that acted by its name or fingerprint, never by its secret.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from groupbuy_client import wire
from groupbuy_client.wire import from_ms, iso_ms, to_ms
from sqlalchemy import JSON, BigInteger, DateTime, Integer, String, Text, delete, select, update
from sqlalchemy.orm import Mapped, mapped_column

from groupbuy.storage.db import Base, Database
from groupbuy.storage.paging import newest_by_id

# The longest reason kept: an operator's sentence, not a document.
REASON_CHARS = 500


class AuditRow(Base):
    """One action: its actor, what it did to which target, the reason given, and when."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str | None] = mapped_column(Text)
    # what the action answered or changed, for the reader (small JSON object)
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class AuditLog:
    """Writes actions to the audit log and reads it newest first, a page at a time."""

    def __init__(self, database: Database, clock: Callable[[], float] = time.time) -> None:
        self._db = database
        self._clock = clock

    async def record(
        self,
        actor: str,
        action: str,
        target: str,
        reason: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> wire.AuditEntry:
        """Write one action and return its entry as `page` shows it."""
        row = self.entry(actor, action, target, reason, detail)
        async with self._db.transaction(urgent=True) as session:
            session.add(row)
            await session.flush()  # its id, for settle and withdraw
        return entry_body(row)

    async def settle(self, entry_id: int, detail: Mapping[str, Any] | None) -> None:
        """Say what an action written ahead (`record` before it ran) came to."""
        async with self._db.transaction(urgent=True) as session:
            await session.execute(
                update(AuditRow).where(AuditRow.id == entry_id).values(detail=jsonable(detail))
            )

    async def withdraw(self, entry_id: int) -> None:
        """Take back an entry written ahead of an action that was then refused (it changed
        nothing, so it is not an action taken)."""
        async with self._db.transaction(urgent=True) as session:
            await session.execute(delete(AuditRow).where(AuditRow.id == entry_id))

    def entry(
        self,
        actor: str,
        action: str,
        target: str,
        reason: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> AuditRow:
        """One action's row, not yet written: for a change that adds it to its own SQL
        transaction, so the change and its audit row are committed together or not at all."""
        return AuditRow(
            at=from_ms(round(self._clock() * 1000)),
            actor=actor[:64],
            action=action[:64],
            target=target[:200],
            reason=reason[:REASON_CHARS] if reason else None,
            detail=jsonable(detail),
        )

    async def page(self, limit: int, cursor: str | None = None) -> wire.AuditPage:
        """The newest entries before `cursor` (the id of the last entry of the previous
        page), at most `limit`; `next_cursor` is None on the last page."""
        rows, next_cursor = await newest_by_id(
            self._db, select(AuditRow), AuditRow.id, limit, cursor
        )
        return {"entries": [entry_body(row) for row in rows], "next_cursor": next_cursor}


def entry_body(row: AuditRow) -> wire.AuditEntry:
    """An audit row as the API and the console show it."""
    return {
        "id": row.id,
        "at": iso_ms(to_ms(row.at)),
        "actor": row.actor,
        "action": row.action,
        "target": row.target,
        "reason": row.reason,
        "detail": row.detail,
    }


def jsonable(detail: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What the detail column keeps: a round trip through JSON keeps only what it can hold."""
    return json.loads(json.dumps(detail, default=str)) if detail else None
