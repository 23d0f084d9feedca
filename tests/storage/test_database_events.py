"""SQLAlchemy's connection events as groupbuy/storage/db.py, Database, uses them.

All of it is SQLAlchemy's public API (the "connect" and "do_connect" events, DBAPIError.orig);
SQLAlchemy wraps only the driver's own errors (DBAPIError), so an error of ours raised in a
listener reaches the caller as raised. These tests hold the service to that on every version
the range in pyproject.toml lets in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, exc, text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.support.database import TestDatabases
from tests.support.servers import free_port


class Refused(Exception):
    """What the do_connect listener raises (as _connect raises DatabaseUnreachable)."""


async def test_do_connect_listener_opens_the_connection_and_its_errors_reach_the_caller_as_raised(
    tmp_path: Path,
) -> None:
    """groupbuy/storage/db.py, Database.__init__ and _connect: a "do_connect" listener on
    the async engine's sync_engine that returns dialect.connect(*cargs, **cparams) opens
    the connection; an exception it raises (not a DBAPI error) reaches the caller of
    engine.connect() as it was raised, not wrapped (undocumented: groupbuy/api/problems.py
    maps it to 503 by its class)."""
    opened: list[int] = []

    def connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        opened.append(1)
        return dialect.connect(*cargs, **cparams)

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'contract.db'}")
    event.listen(engine.sync_engine, "do_connect", connect)
    try:
        async with engine.connect() as connection:
            assert (await connection.execute(text("SELECT 41 + 1"))).scalar() == 42
    finally:
        await engine.dispose()
    assert opened == [1]

    def refuse(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        raise Refused("no connection")

    refusing = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'refused.db'}")
    event.listen(refusing.sync_engine, "do_connect", refuse)
    try:
        with pytest.raises(Refused) as raised:
            async with refusing.connect():
                pass
    finally:
        await refusing.dispose()
    assert type(raised.value) is Refused


async def test_do_connect_listener_sees_a_refused_asyncpg_connection_as_oserror() -> None:
    """groupbuy/storage/db.py, _connect: on PostgreSQL, dialect.connect() called inside the
    "do_connect" listener raises the operating system's error (an OSError) when the
    server refuses the connection, which is how _connect tells "unreachable" apart."""
    pytest.importorskip("asyncpg")
    seen: list[BaseException] = []

    def connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        try:
            return dialect.connect(*cargs, **cparams)
        except BaseException as error:
            seen.append(error)
            raise Refused(str(error)) from error

    engine = create_async_engine(
        f"postgresql+asyncpg://contract@127.0.0.1:{free_port()}/contract",
        connect_args={"timeout": 5},
    )
    event.listen(engine.sync_engine, "do_connect", connect)
    try:
        with pytest.raises(Refused):
            async with engine.connect():
                pass
    finally:
        await engine.dispose()
    [error] = seen
    assert isinstance(error, OSError)


async def test_connect_listener_gets_the_aiosqlite_connection_with_a_cursor(
    tmp_path: Path,
) -> None:
    """groupbuy/storage/db.py, Database.__init__ and sqlite_pragmas: a "connect" listener
    gets aiosqlite's adapted connection, whose cursor() runs the PRAGMAs synchronously
    before the connection is used."""

    def pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=4321")
        cursor.close()

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'contract.db'}")
    event.listen(engine.sync_engine, "connect", pragmas)
    try:
        async with engine.connect() as connection:
            mode = (await connection.execute(text("PRAGMA journal_mode"))).scalar()
            busy = (await connection.execute(text("PRAGMA busy_timeout"))).scalar()
    finally:
        await engine.dispose()
    assert (mode, busy) == ("wal", 4321)


def chain(error: BaseException | None) -> list[BaseException]:
    found: list[BaseException] = []
    while error is not None and error not in found:
        found.append(error)
        error = error.__cause__
    return found


@pytest.mark.postgres
async def test_asyncpg_error_orig_chain_carries_the_sqlstate(test_databases: TestDatabases) -> None:
    """groupbuy/storage/db.py, unavailable and causes: an asyncpg error reaches the caller as
    a DBAPIError whose `orig` (SQLAlchemy's adapted error), or an error in its __cause__
    chain, has asyncpg's `sqlstate`; unavailable() tells a server that cannot serve
    (08, 53, 57) from a fault of the statement by it."""
    engine = create_async_engine(test_databases.url(test_databases.shared))
    try:
        with pytest.raises(exc.DBAPIError) as raised:
            async with engine.connect() as connection:
                await connection.execute(text("SELECT 1 / 0"))
    finally:
        await engine.dispose()
    states = [getattr(cause, "sqlstate", None) for cause in chain(raised.value.orig)]
    assert "22012" in states  # division_by_zero
