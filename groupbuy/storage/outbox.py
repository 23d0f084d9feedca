"""Write-behind from Redis to SQL: scripts append records to an outbox stream in the
same atomic call as the state change; this writer turns them into SQL rows.

Every record carries its own identity (a business key), so inserting it twice is a
no-op. That is why the writer needs no consumer group: it reads the stream from the
start, applies a batch in one SQL transaction, and only after the commit deletes the
batch from the stream. A writer that dies midway leaves the entries in place and the
next flush (of any process) applies them again harmlessly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.storage.db import Database
from groupbuy.storage.events import Event, record_events
from groupbuy.storage.scripts import Scripts

log = logging.getLogger(__name__)

Projector = Callable[[AsyncSession, list[dict[str, str]]], Awaitable[list[Event]]]


class OutboxWriter:
    """Drains outbox streams into SQL, one transaction per batch."""

    def __init__(
        self, redis: Any, scripts: Scripts, database: Database, project: Projector, batch_size: int
    ) -> None:
        self._redis = redis
        self._scripts = scripts
        self._db = database
        self._project = project
        self._batch_size = batch_size
        # Per stream: the flush running now, and the one queued to start after it.
        self._current: dict[str, asyncio.Task[int]] = {}
        self._queued: dict[str, asyncio.Task[int]] = {}

    async def flush(self, stream: str) -> int:
        """Apply every entry now in `stream` to SQL; returns how many the flush applied.

        Callers share flushes: one that is queued and has not started yet will see every
        entry written before this call, so a caller joins it instead of queueing its own.
        Under load (many confirms of one activity at once) that turns N flushes into two.
        The flush runs in its own task, shielded: a cancelled caller never interrupts it
        mid-SQL.
        """
        queued = self._queued.get(stream)
        if queued is None:
            queued = asyncio.create_task(self._after(self._current.get(stream), stream))
            self._queued[stream] = queued
        return await asyncio.shield(queued)

    async def _after(self, previous: asyncio.Task[int] | None, stream: str) -> int:
        if previous is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        me = asyncio.current_task()
        assert me is not None
        if self._queued.get(stream) is me:
            del self._queued[stream]
        self._current[stream] = me
        try:
            return await self._drain(stream)
        finally:
            if self._current.get(stream) is me:
                del self._current[stream]

    async def _drain(self, stream: str) -> int:
        applied = 0
        while True:
            entries = await self._redis.xrange(stream, "-", "+", count=self._batch_size)
            if not entries:
                return applied
            async with self._db.transaction() as session:
                events = await self._project(session, [fields for _id, fields in entries])
                await record_events(session, events)
            ids = [entry_id for entry_id, _ in entries]
            # Only scripts add to a team stream, and they recreate it: an empty one can go.
            await self._scripts.call("outbox_ack", [stream], ["", "1", *ids])
            applied += len(entries)

    async def flush_quietly(self, stream: str) -> None:
        """Flush, logging instead of raising: the background loop will retry what failed."""
        try:
            await self.flush(stream)
        except Exception:
            log.warning(
                "outbox flush of %s failed; will retry in the background", stream, exc_info=True
            )
