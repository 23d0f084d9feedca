"""The journal of acknowledged grabs: what this process answered `grabbed`, written to SQL.

A grab is decided in Redis and reaches SQL later through the packet's outbox stream. If
Redis loses the packet before the write-behind read it (a FLUSHALL, a restart without
AOF, a failover that lost the last writes), nothing in Redis or in the stream remembers
that the user was told `grabbed`. This journal is the trace kept apart from Redis: each
answer is noted in memory and written to SQL in batches, and reconciliation reports any
noted grab whose grab row never arrived. It costs one multi-row INSERT per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from groupbuy_client.wire import from_ms

from groupbuy.redpacket.models import AcknowledgedGrabRow
from groupbuy.storage.db import Database, dialect_insert

log = logging.getLogger(__name__)

# Answers kept in memory while SQL cannot take them. Past this the oldest are dropped: the
# grabs themselves wait safely in Redis; only the trace for a simultaneous Redis loss thins.
MAX_WAITING = 200_000
# Longest `stop` waits for a flush in progress (SQL slow or away) before cancelling it.
STOP_WAIT_S = 10.0


class AckJournal:
    """Grabs this process acknowledged, flushed to `acknowledged_grabs` every interval."""

    def __init__(self, database: Database, interval_s: float) -> None:
        self._db = database
        self._interval_s = interval_s
        self._noted: list[dict[str, object]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.dropped = 0  # answers forgotten because SQL was away too long

    def note(
        self, packet_id: str, user_id: str, epoch: int, seq: int, amount_cents: int, at_ms: int
    ) -> None:
        """Remember one `grabbed` answer (no I/O: the next flush writes it)."""
        if len(self._noted) >= MAX_WAITING:
            self._trim(len(self._noted) - MAX_WAITING + MAX_WAITING // 10)
        self._noted.append(
            {
                "packet_id": packet_id,
                "user_id": user_id,
                "epoch": epoch,
                "seq": seq,
                "amount_cents": amount_cents,
                "acked_at": from_ms(at_ms),
                "source": "answer",
            }
        )

    @property
    def waiting(self) -> int:
        """Answers noted and not yet written."""
        return len(self._noted)

    async def flush(self) -> int:
        """Write what was noted; on a failure the rows stay for the next flush."""
        rows, self._noted = self._noted, []
        if not rows:
            return 0
        try:
            async with self._db.transaction() as session:
                await session.execute(
                    dialect_insert(session, AcknowledgedGrabRow.__table__).on_conflict_do_nothing(),
                    rows,
                )
        except BaseException:
            self._noted[:0] = rows
            self._trim(len(self._noted) - MAX_WAITING)
            raise
        return len(rows)

    def _trim(self, excess: int) -> None:
        """Forget the `excess` oldest answers (SQL has been away too long to keep them all)."""
        if excess > 0:
            del self._noted[:excess]
            self.dropped += excess
            log.warning("%d acknowledged grabs dropped from the journal (SQL away)", excess)

    def start(self) -> None:
        """Flush every interval in the background until `stop`."""
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop the background flushes, then write what is left.

        A flush in progress is let finish, not cancelled: a cancellation that lands while
        the connection pool resets a connection is swallowed there (SQLAlchemy logs it as
        "Exception during reset"), so the loop went on flushing and the shutdown waited
        for it for ever. Only a flush still running after STOP_WAIT_S is cancelled.
        """
        task, self._task = self._task, None
        if task is not None:
            self._stopping.set()
            finished, _ = await asyncio.wait({task}, timeout=STOP_WAIT_S)
            if not finished:
                task.cancel()
                await asyncio.wait({task}, timeout=STOP_WAIT_S)
            elif not task.cancelled() and task.exception() is not None:
                log.warning("the journal's flush loop ended with %r", task.exception())
        with contextlib.suppress(Exception):
            await self.flush()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)
            try:
                await self.flush()
            except Exception as exc:  # SQL away: keep the rows, say so once per failure
                log.warning("acknowledged grabs not written yet (%s); retrying", exc)
