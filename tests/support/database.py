"""SQL databases for the tests: a SQLite file of the test's own, or a PostgreSQL database.

PostgreSQL is a server the developer runs (GROUPBUY_TEST_DATABASE_URL, on which the tests
create and drop databases of their own) or a throwaway cluster (tests/support/postgres.py).
The tests share one database migrated to the head revision, emptied before each test: deleting the
rows of every table and restarting the id sequences took ~15 ms where CREATE DATABASE from
a template plus DROP DATABASE took 0.25-1 s, and TRUNCATE ... RESTART IDENTITY ~140 ms
(measured on the 2-core test machine, loaded). Connections a test left open are closed
first, so nothing of one test writes into the next.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import make_url

from groupbuy.migrations import upgrade
from groupbuy.storage.db import Base, Database
from tests.support.postgres import PostgresProcess, start_postgres
from tests.support.schema import database_with_schema
from tests.support.starting import started_or_skip

T = TypeVar("T")


def start_postgres_or_skip() -> PostgresProcess:
    """A throwaway PostgreSQL cluster; where PostgreSQL is not installed the test skips,
    except in CI (`CI` set), where that is an error."""
    return started_or_skip(
        start_postgres,
        "PostgreSQL is not installed (scripts/test.sh installs it, or point "
        "GROUPBUY_TEST_DATABASE_URL at a server you run)",
    )


def throwaway_postgres() -> Iterator[PostgresProcess]:
    """For a fixture: a throwaway cluster (start_postgres_or_skip), stopped at the end."""
    server = start_postgres_or_skip()
    try:
        yield server
    finally:
        server.stop()


# The session time zone of the tests' PostgreSQL databases (UTC+13:45 in its summer).
SESSION_TIMEZONE = "Pacific/Chatham"


async def create_schema(database: Database) -> None:
    """Give an empty database the service's schema: the shipped migrations, as
    tests.support.schema does for its templates."""
    await upgrade(database)


def sqlite_with_schema(directory: Path) -> str:
    """The URL of a SQLite file in `directory` at the head revision (a copy of the template
    of tests.support.schema)."""
    return database_with_schema(directory)


def sqlite_file(directory: Path) -> Path:
    """The SQLite file of a test whose files are in `directory`."""
    return directory / "groupbuy.db"


def sqlite_url(directory: Path) -> str:
    """The URL of the SQLite file in `directory`."""
    return f"sqlite+aiosqlite:///{sqlite_file(directory)}"


def _run(coro: Coroutine[Any, Any, T]) -> T:
    # Fixtures are synchronous; a thread of its own keeps this loop apart from the test's.
    results: list[T] = []
    failures: list[BaseException] = []

    def target() -> None:
        try:
            results.append(asyncio.run(coro))
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=target, name="test-databases")
    thread.start()
    thread.join()
    if failures:
        raise failures[0]
    return results[0]


class TestDatabases:
    """The tests' databases on one PostgreSQL server (`server_url`, an SQLAlchemy asyncpg URL
    of a database the role may connect to; the role may create databases)."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, server_url: str) -> None:
        self.server_url = make_url(server_url)
        # Names of their own per run, so that two runs can share a developer's server.
        self.prefix = f"groupbuy_test_{os.getpid()}"
        self.shared = self.prefix
        self._numbers = itertools.count(1)
        self._sequences: list[str] = []

    def url(self, name: str) -> str:
        """The SQLAlchemy URL of the database `name` on this server."""
        return self.server_url.set(database=name).render_as_string(hide_password=False)

    def start(self) -> None:
        """Make the shared database and give it the schema."""
        self._create(self.shared)
        self._sequences = _run(self._fetch_sequences())

    def shared_empty(self) -> str:
        """The shared database, emptied: no rows, ids from 1, no other connection; its URL."""
        statements = [
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
            *(f'DELETE FROM "{table.name}"' for table in reversed(Base.metadata.sorted_tables)),
            *(f'ALTER SEQUENCE "{name}" RESTART' for name in self._sequences),
        ]
        _run(self._execute(self.shared, statements))
        return self.url(self.shared)

    def create(self) -> str:
        """A database of its own holding the schema (for a fixture that outlives a test;
        drop it with `drop`); returns its name."""
        name = f"{self.prefix}_{next(self._numbers)}"
        self._create(name)
        return name

    def drop(self, name: str) -> None:
        """Drop a database, closing whatever connection is left on it."""
        _run(self._execute(None, [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)']))

    def stop(self) -> None:
        """Drop the shared database."""
        self.drop(self.shared)

    def _create(self, name: str) -> None:
        _run(self._execute(None, [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)']))
        # Sessions in a zone far from UTC: a timestamp handled as local time anywhere shows.
        _run(
            self._execute(
                None,
                [
                    f'CREATE DATABASE "{name}"',
                    f"ALTER DATABASE \"{name}\" SET timezone TO '{SESSION_TIMEZONE}'",
                ],
            )
        )

        async def schema() -> None:
            database = Database(self.url(name))
            try:
                await create_schema(database)
            finally:
                await database.dispose()

        _run(schema())

    async def _fetch_sequences(self) -> list[str]:
        connection = await self._connect(self.shared)
        try:
            rows = await connection.fetch("SELECT sequencename FROM pg_sequences")
            return [str(row[0]) for row in rows]
        finally:
            await connection.close()

    async def _execute(self, database: str | None, statements: list[str]) -> None:
        connection = await self._connect(database)
        try:
            for statement in statements:
                await connection.execute(statement)
        finally:
            await connection.close()

    async def _connect(self, database: str | None) -> Any:
        import asyncpg  # the `postgres` extra: needed only when the tests use PostgreSQL

        url = self.server_url.set(drivername="postgresql")
        if database is not None:
            url = url.set(database=database)
        return await asyncpg.connect(url.render_as_string(hide_password=False))


def fail_writes(
    monkeypatch: Any, database: Database, error: Callable[[], Exception], times: int | None = None
) -> None:
    """Make the database's write transactions fail with `error()`: both kinds, a pooled
    session's (`transaction`) and a stepped one's (`run_steps`, the write-behind's batches),
    the next `times` times (None: until the test undoes it), as SQL down or locked does."""
    real_transaction, real_run_steps = database.transaction, database.run_steps
    left = {"times": times}

    def failing() -> bool:
        if left["times"] is None:
            return True
        if left["times"]:
            left["times"] -= 1
            return True
        return False

    def transaction(*args: Any, **kwargs: Any) -> Any:
        if failing():
            raise error()
        return real_transaction(*args, **kwargs)

    async def run_steps(*args: Any, **kwargs: Any) -> Any:
        if failing():
            raise error()
        return await real_run_steps(*args, **kwargs)

    monkeypatch.setattr(database, "transaction", transaction)
    monkeypatch.setattr(database, "run_steps", run_steps)
