"""Blocked users: an admin's list of user ids that may not take a seat or money.

SQL holds the record (the `blocked_users` table); Redis holds a copy in one hash
(`Keys.blocked_users`: user_id -> 'blocked_at_ms|reason') that the scripts of a seat lock,
join, open, confirm, grab and send read in the same call as the operation, so a block
takes effect atomically with them. In Redis Cluster those scripts read the copy of their
own slot instead (user_id -> '1'), one per slot in use: a change writes the
hash and then every slot's copy (groupbuy/storage/slots.py). A change writes SQL and Redis
under one lock: SQL first (flushed, so a refusal comes before Redis changes), then Redis,
then the commit, which also holds the action's audit row; a commit that fails puts Redis
back. `sync` (at start and in the repair job) rebuilds each copy from SQL
when it differs, e.g. after Redis lost its data.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from groupbuy_client import wire
from groupbuy_client.wire import from_ms, iso_ms, to_ms
from sqlalchemy import DateTime, String, func, select
from sqlalchemy.orm import Mapped, mapped_column

from groupbuy.ops.audit import AuditRow, jsonable
from groupbuy.storage.backends import UsesBackends
from groupbuy.storage.db import Base
from groupbuy.storage.slots import COPY_VALUE, each_slot

log = logging.getLogger(__name__)
REASON_MAX = 500  # characters of an admin's note on a block
# Fields written per HSET when the copy is rebuilt.
REBUILD_CHUNK = 1000


class BlockedUserRow(Base):
    """One blocked user: when the block began and the admin's reason."""

    __tablename__ = "blocked_users"

    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    reason: Mapped[str | None] = mapped_column(String(REASON_MAX), nullable=True)
    blocked_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def redis_value(row: BlockedUserRow) -> str:
    """The Redis copy's value for a blocked user (the scripts only test that the field exists)."""
    return f"{to_ms(row.blocked_at)}|{row.reason or ''}"


def _body(row: BlockedUserRow) -> wire.BlockedUser:
    return {
        "user_id": row.user_id,
        "reason": row.reason,
        "blocked_at": iso_ms(to_ms(row.blocked_at)),
    }


class BlocklistService(UsesBackends):
    """Block and unblock users, list them, and keep Redis's copy equal to SQL's record."""

    def _lock(self) -> Any:
        # Changes, rebuilds and slots joining the directory take turns, so none of them
        # writes back a list read before a change that landed meanwhile.
        return self._slots.blocklist_lock()

    async def _slot_copies(self) -> list[str]:
        """The per-slot copies of the hash (Redis Cluster), one per slot in use; none on one
        Redis server."""
        if not self._keys.cluster:
            return []
        return [self._keys.blocked_users(slot) for slot in await self._slots.in_use()]

    async def _on_each(self, keys: list[str], write: Any) -> None:
        """Apply `write(pipe, key)` to every key, pipelined."""
        await each_slot(self._redis, keys, write)

    async def block(
        self, user_id: str, reason: str | None = None, audit: AuditRow | None = None
    ) -> wire.BlockedUser:
        """Block a user (again: the reason is replaced, the start of the block kept). `audit`,
        the action's audit row, is committed with the change (its detail: the entry)."""
        now_ms = await self._clock.now_ms(self._redis)
        async with self._lock():
            previous: str | None = None
            written = False
            try:
                async with self._db.transaction(urgent=True) as session:
                    row = await session.get(BlockedUserRow, user_id, with_for_update=True)
                    if row is None:
                        row = BlockedUserRow(user_id=user_id, blocked_at=from_ms(now_ms))
                        session.add(row)
                    else:
                        previous = redis_value(row)
                    row.reason = reason
                    body = _body(row)
                    if audit is not None:
                        audit.detail = audit.detail or jsonable(body)
                        session.add(audit)
                    # SQL refuses now if it will, before Redis changes; Redis before the
                    # commit: if Redis fails, the SQL change rolls back too.
                    await session.flush()
                    written = True
                    await self._write(user_id, redis_value(row))
            except BaseException:
                if written:  # the commit failed: Redis back to what SQL still holds
                    await self._undo(user_id, previous)
                raise
        return body

    async def unblock(self, user_id: str, audit: AuditRow | None = None) -> dict[str, Any]:
        """Lift a user's block; `unblocked` is false when the user was not blocked. `audit`,
        the action's audit row, is committed with the change."""
        async with self._lock():
            previous: str | None = None
            written = False
            try:
                async with self._db.transaction(urgent=True) as session:
                    row = await session.get(BlockedUserRow, user_id, with_for_update=True)
                    if row is not None:
                        previous = redis_value(row)
                        await session.delete(row)
                    body = {"user_id": user_id, "unblocked": row is not None}
                    if audit is not None:
                        audit.detail = audit.detail or body
                        session.add(audit)
                    await session.flush()
                    written = True
                    await self._write(user_id, None)
            except BaseException:
                if written:
                    await self._undo(user_id, previous)
                raise
        return body

    async def _write(self, user_id: str, value: str | None) -> None:
        """Set (`value`) or remove (None) a user in Redis's copies: the hash and, in Redis
        Cluster, every slot's copy."""
        copies = await self._slot_copies()
        if value is None:
            await self._redis.hdel(self._keys.blocked_users(), user_id)
            await self._on_each(copies, lambda pipe, key: pipe.hdel(key, user_id))
        else:
            await self._redis.hset(self._keys.blocked_users(), user_id, value)
            await self._on_each(copies, lambda pipe, key: pipe.hset(key, user_id, COPY_VALUE))

    async def _undo(self, user_id: str, previous: str | None) -> None:
        """Put Redis back as SQL has it after a change whose commit failed (best effort: if
        Redis fails too, the repair job's `sync` finds the copies differing and rebuilds)."""
        try:
            await self._write(user_id, previous)
        except Exception:
            log.warning("could not undo a blocklist change in Redis", exc_info=True)

    async def page(self, limit: int, cursor: str | None = None) -> dict[str, Any]:
        """Blocked users in user id order after `cursor` (the last id of the previous page)."""
        query = select(BlockedUserRow).order_by(BlockedUserRow.user_id).limit(limit + 1)
        if cursor:
            query = query.where(BlockedUserRow.user_id > cursor)
        async with self._db.sessions() as session:
            rows = list((await session.scalars(query)).all())
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "blocked_users": [_body(row) for row in rows],
            "next_cursor": rows[-1].user_id if more else None,
        }

    async def sync(self) -> dict[str, int]:
        """Rebuild Redis's copies from SQL where they differ in size (Redis lost data, or a
        change reached only some of them): the hash, and in Redis Cluster each slot's copy;
        the repair job's part, also run at start. `blocklist_rebuilt` counts the copies
        rewritten."""
        key = self._keys.blocked_users()
        async with self._lock():
            copies = [key, *await self._slot_copies()]
            async with self._db.sessions() as session:
                recorded = int(
                    await session.scalar(select(func.count(BlockedUserRow.user_id))) or 0
                )
                sizes = await each_slot(self._redis, copies, lambda pipe, k: pipe.hlen(k))
                stale = [k for k, size in zip(copies, sizes, strict=True) if size != recorded]
                if not stale:
                    return {"blocked_users": recorded, "blocklist_rebuilt": 0}
                rows = (await session.scalars(select(BlockedUserRow))).all()
            for copy in stale:
                # One MULTI per copy: the scripts of its slot see the old list or the new one.
                pipe = self._redis.pipeline(transaction=True)
                pipe.delete(copy)
                for start in range(0, len(rows), REBUILD_CHUNK):
                    chunk = rows[start : start + REBUILD_CHUNK]
                    pipe.hset(
                        copy,
                        mapping={
                            row.user_id: redis_value(row) if copy == key else COPY_VALUE
                            for row in chunk
                        },
                    )
                await pipe.execute()
        return {"blocked_users": len(rows), "blocklist_rebuilt": len(stale)}
