"""A SQLite file's bulk writer: one sqlite3 connection owned by one thread, a whole
transaction per call.

Through SQLAlchemy and aiosqlite, every statement is a hop to the driver's thread and a
wake-up of the event loop on its way back; a write-behind batch of nine statements pays
that nine times, and its turn as the file's writer lasts as long. Here the batch's steps
(groupbuy/storage/steps.py) run in the thread in one call: BEGIN IMMEDIATE, the
statements, COMMIT. The caller holds this process's writer turn meanwhile
(Database.run_steps), so the file still has one writer of this process at a time.

The connection has the service's pragmas (WAL, synchronous=NORMAL, the busy timeout). Its
errors come out as SQLAlchemy's (OperationalError, IntegrityError, ...), so the API's 503
and the write-behind's transient-or-poison judgement (groupbuy/storage/deadletters.py)
read them as they read the pool's.
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


def sqlite_pragmas(connection: sqlite3.Connection, busy_timeout_ms: int) -> None:
    """The service's settings of a SQLite connection (the pool's and the bulk writer's)."""
    # WAL lets readers run while a writer commits; busy_timeout waits for the lock.
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
    # NORMAL: a commit is durable once the WAL is checkpointed or synced, and survives a
    # crash of the process; an OS crash may lose the last commits. The write-behind's
    # records stay in their Redis stream until their commit, and are read again if lost.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


class SQLiteThread:
    """One SQLite file's bulk writer: `transaction(steps)` runs a stepped transaction in
    the thread that owns the connection (opened on first use, again after a failure)."""

    def __init__(self, path: str, busy_timeout_s: float) -> None:
        self._path = path
        self._busy_timeout_ms = round(busy_timeout_s * 1000)
        # Started on first use and again after close(): an engine disposed at shutdown may
        # serve again (SQLAlchemy's pool does), and so may this writer.
        self._executor: ThreadPoolExecutor | None = None
        self._connection: sqlite3.Connection | None = None  # touched only in the thread

    async def transaction(self, steps: Callable[[], Steps[R]]) -> R:
        """Run the steps `steps()` makes in one transaction, committed on success.

        A cancelled caller still waits for the transaction to end (committed or rolled
        back) before it goes: the writer turn it holds must not pass on while the thread
        still writes."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        future = asyncio.get_running_loop().run_in_executor(self._executor, self._run, steps)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait({future})
            raise

    def _run(self, steps: Callable[[], Steps[R]]) -> R:
        connection = self._connection or self._open()
        try:
            connection.execute("BEGIN IMMEDIATE")
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
        connection = sqlite3.connect(
            self._path, timeout=self._busy_timeout_ms / 1000, isolation_level=None
        )
        sqlite_pragmas(connection, self._busy_timeout_ms)
        self._connection = connection
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
        """Close the connection and stop the thread (after the transaction running now); a
        later transaction starts them again."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        await asyncio.get_running_loop().run_in_executor(executor, self._close_connection)
        executor.shutdown(wait=False)


def _as_sqlalchemy(error: sqlite3.Error) -> exc.StatementError:
    """A sqlite3 error as SQLAlchemy raises it for the same failure (no parameters shown:
    they may carry secrets)."""
    return exc.DBAPIError.instance(
        None, None, error, sqlite3.Error, hide_parameters=True, dialect=None
    )
