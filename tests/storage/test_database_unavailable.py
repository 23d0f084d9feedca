"""Which database errors mean "unavailable" — 503 database_unavailable in the API, a batch
the write-behind retries rather than dead-letters — judged in one place for both; and the
bound on how long a SQLite writer waits."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import asyncpg
import pytest
import sqlalchemy.exc
from sqlalchemy import text

from groupbuy.storage.db import Database, DatabaseBusy, DatabaseUnreachable, unavailable
from groupbuy.storage.deadletters import is_poison
from tests.support.database import sqlite_with_schema


def wrapped(orig: BaseException) -> sqlalchemy.exc.DBAPIError:
    """What asyncpg's errors look like to SQLAlchemy: a plain DBAPIError around them."""
    return sqlalchemy.exc.DBAPIError("INSERT", {}, orig)


def caused_by(cause: BaseException) -> Exception:
    error = Exception("driver error")
    error.__cause__ = cause
    return error


UNAVAILABLE = {
    "sqlite locked": sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database is locked")),
    "interface": sqlalchemy.exc.InterfaceError("SELECT 1", {}, Exception("connection is closed")),
    "closed mid-statement": wrapped(
        asyncpg.exceptions.ConnectionDoesNotExistError("closed in the middle of operation")
    ),
    "starting up": wrapped(asyncpg.exceptions.CannotConnectNowError("not yet accepting")),
    "shutting down": wrapped(asyncpg.exceptions.AdminShutdownError("administrator command")),
    "crash of another backend": wrapped(asyncpg.exceptions.CrashShutdownError("crash")),
    "too many connections": wrapped(asyncpg.exceptions.TooManyConnectionsError("too many")),
    "statement timeout": wrapped(asyncpg.exceptions.QueryCanceledError("statement timeout")),
    "reset under the driver": wrapped(caused_by(ConnectionResetError())),
    "pool timeout": sqlalchemy.exc.TimeoutError("QueuePool limit of size 5 reached"),
    "connect refused": DatabaseUnreachable("[Errno 111] Connect call failed"),
    "no turn to write": DatabaseBusy("no turn to write within 1 s"),
}

NOT_UNAVAILABLE = {
    "constraint": sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("NOT NULL constraint")),
    "value": sqlalchemy.exc.DataError("INSERT", {}, Exception("value too long")),
    "server's data error": wrapped(asyncpg.exceptions.StringDataRightTruncationError("long")),
    "server's unique violation": wrapped(asyncpg.exceptions.UniqueViolationError("dup")),
    "a plain driver error": wrapped(Exception("driver error")),
    "a record's own error": KeyError("seq"),
    # An OSError that did not come through the database is not the database's: a bug to see.
    "bare refused": ConnectionRefusedError(),
}


@pytest.mark.parametrize("error", UNAVAILABLE.values(), ids=UNAVAILABLE.keys())
def test_the_database_being_away_is_unavailable_and_never_poison(error: Exception) -> None:
    assert unavailable(error)
    assert not is_poison(error)


@pytest.mark.parametrize("error", NOT_UNAVAILABLE.values(), ids=NOT_UNAVAILABLE.keys())
def test_errors_of_the_statement_or_its_values_are_not_unavailable(error: Exception) -> None:
    assert not unavailable(error)


def test_a_lost_connection_says_so_whatever_its_sqlstate() -> None:
    lost = wrapped(asyncpg.exceptions.StringDataRightTruncationError("long"))
    lost.connection_invalidated = True
    assert unavailable(lost) and not is_poison(lost)


async def test_a_refused_connection_is_named_unreachable() -> None:
    """SQLAlchemy passes the OSError of a refused connect on bare; the engine names it."""
    database = Database("postgresql+asyncpg://gb@127.0.0.1:1/nothing", timeout_s=5)
    try:
        with pytest.raises(DatabaseUnreachable) as raised:
            await database.ping()
        assert isinstance(raised.value.__cause__, OSError)
        assert unavailable(raised.value)
    finally:
        await database.dispose()


async def test_sqlite_writers_wait_at_most_about_their_timeout_for_a_lock_held_elsewhere(
    tmp_path: Path,
) -> None:
    """Ten writers queued behind a lock another connection holds all fail unavailable within
    about two timeouts (their turn, then the busy wait), not one timeout after another."""
    url = sqlite_with_schema(tmp_path)
    database = Database(url, timeout_s=0.3)
    locker = sqlite3.connect(url.removeprefix("sqlite+aiosqlite:///"), isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")

    async def write() -> BaseException | None:
        try:
            async with database.transaction() as session:
                await session.execute(text("DELETE FROM team_members"))
        except Exception as error:
            return error
        return None

    try:
        began = time.monotonic()
        failures = await asyncio.gather(*(write() for _ in range(10)))
        took = time.monotonic() - began
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    try:
        assert all(f is not None and unavailable(f) for f in failures), failures
        assert any(isinstance(f, DatabaseBusy) for f in failures), failures
        # One after another they would take 10 x 0.3 s at least.
        assert took < 2.5, took
        assert await write() is None  # the lock is gone: writes go through again
    finally:
        await database.dispose()
