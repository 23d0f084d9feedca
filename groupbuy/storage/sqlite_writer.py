"""A SQLite file's writer of stepped transactions: one sqlite3 connection, a whole
transaction per call, run on the event loop's own thread unless it is big or would have to wait.

Through SQLAlchemy and aiosqlite, every statement is a hop to the driver's thread and a
wake-up of the event loop on its way back. Even one hop per transaction, to a thread of
its own, cost more than the transaction under load: each hand-over between the threads
waits for the GIL and for a core, so a confirm's commit of a few rows took milliseconds
at the median and tens at p99, where its SQLite work is well under one
(docs/benchmarks-findings.md). So the transaction runs where its caller runs: BEGIN
IMMEDIATE, the statements, COMMIT, with nothing awaited in between. A big batch (a
backlog drained after an outage) would hold the loop for milliseconds: it runs in the
writer's thread, where the other lanes' Redis work goes on beside it.

The loop must never wait for a lock another process holds (another API worker, a
`groupbuy worker`): on the loop, BEGIN IMMEDIATE waits for no lock (busy timeout 0). When
the file's write lock is held elsewhere, the transaction runs instead in the writer's
thread, which waits up to the busy timeout. Either way the caller holds this process's
writer turn (Database.run_steps), so the connection has one user at a time.

The connection has the service's pragmas (WAL, synchronous=NORMAL). Its errors come out
as SQLAlchemy's (OperationalError, IntegrityError, ...), so the API's 503 and the
write-behind's transient-or-poison judgement (groupbuy/storage/deadletters.py) read them
as they read the pool's.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import exc

from groupbuy.storage.steps import Steps, run_on_connection

R = TypeVar("R")

# Records from which a transaction runs in the writer's thread: on the loop, SQLite takes
# about 25 us per record (docs/benchmarks-findings.md), so the loop waits ~2.5 ms at most.
BIG_BATCH = 100


def sqlite_pragmas(connection: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """The service's settings of a SQLite connection (the pool's and the writer's)."""
    # WAL lets readers run while a writer commits; busy_timeout waits for the lock.
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
    # NORMAL: a commit is durable once the WAL is checkpointed or synced, and survives a
    # crash of the process; an OS crash may lose the last commits. The write-behind's
    # records stay in their Redis stream until their commit, and are read again if lost.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


class _LockedElsewhere(Exception):
    """BEGIN IMMEDIATE on the loop found the file's write lock held by another process."""


class SQLiteWriter:
    """One SQLite file's writer: `transaction(steps)` runs a stepped transaction on the
    calling thread, or in the writer's thread when it is big or another process holds the
    write lock (the connection is opened on first use, again after a failure)."""

    def __init__(self, path: str, busy_timeout_s: float) -> None:
        self._path = path
        self._busy_timeout_ms = round(busy_timeout_s * 1000)
        # Started when a transaction first has to wait, again after close().
        self._executor: ThreadPoolExecutor | None = None
        self._connection: sqlite3.Connection | None = None
        self._waits = True  # whether the connection's busy timeout is set (not 0)

    async def transaction(self, steps: Callable[[], Steps[R]], records: int = 0) -> R:
        """Run the steps `steps()` makes in one transaction, committed on success
        (`records`: how many records it writes; BIG_BATCH or more go to the thread).

        A cancelled caller whose transaction went to the thread still waits for it to end
        (committed or rolled back) before it goes: the writer turn it holds must not pass
        on while the thread still writes."""
        if records < BIG_BATCH:
            try:
                return self._run(steps, wait=False)
            except _LockedElsewhere:
                pass
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._run, steps, True)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait({future})
            raise

    def _run(self, steps: Callable[[], Steps[R]], wait: bool) -> R:
        connection = self._connection or self._open()
        try:
            if wait != self._waits:
                connection.execute(f"PRAGMA busy_timeout={self._busy_timeout_ms if wait else 0}")
                self._waits = wait
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            if not wait and error.sqlite_errorcode == sqlite3.SQLITE_BUSY:
                raise _LockedElsewhere from error
            raise _as_sqlalchemy(error) from error
        try:
            result = run_on_connection(connection, steps())
            connection.execute("COMMIT")
            return result
        except BaseException as error:
            self._roll_back(connection)
            if isinstance(error, sqlite3.Error):
                raise _as_sqlalchemy(error) from error
            raise

    def _open(self) -> sqlite3.Connection:
        # isolation_level None: the transaction is this class's own BEGIN and COMMIT.
        # check_same_thread off: the loop's thread and the writer's take turns on it.
        connection = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout_ms / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        sqlite_pragmas(connection, self._busy_timeout_ms)
        self._connection, self._waits = connection, True
        return connection

    def _roll_back(self, connection: sqlite3.Connection) -> None:
        try:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
        except sqlite3.Error:
            # The connection itself may be what failed: the next call opens another.
            self._close_connection()

    def _close_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(sqlite3.Error):
                connection.close()

    async def close(self) -> None:
        """Close the connection and stop the thread (after a transaction it runs now); a
        later transaction opens them again."""
        executor, self._executor = self._executor, None
        if executor is None:
            self._close_connection()
            return
        await asyncio.get_running_loop().run_in_executor(executor, self._close_connection)
        executor.shutdown(wait=False)


def _as_sqlalchemy(error: sqlite3.Error) -> exc.StatementError:
    """A sqlite3 error as SQLAlchemy raises it for the same failure (no parameters shown:
    they may carry secrets)."""
    return exc.DBAPIError.instance(
        None, None, error, sqlite3.Error, hide_parameters=True, dialect=None
    )
