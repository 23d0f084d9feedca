"""The one place tests give a database its schema: the shipped migrations, run once per
test run into a template that each test then copies (a SQLite file, or a PostgreSQL
database made WITH TEMPLATE), so a test's database costs a copy, not a migration."""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy.ext.asyncio import create_async_engine

from groupbuy.migrations import upgrade
from groupbuy.storage.db import Database
from tests.support.postgres import PostgresProcess

T = TypeVar("T")

_lock = threading.Lock()
_sqlite_template: Path | None = None
_postgres_templates: set[int] = set()
_TEMPLATE = "groupbuy_template"


def database_with_schema(
    place: Path, postgres: PostgresProcess | None = None, name: str = "groupbuy"
) -> str:
    """The URL of a new database at the head revision: the SQLite file `place`/`name`.db,
    or with `postgres` the new database `name` on that cluster."""
    if postgres is None:
        path = place / f"{name}.db"
        if not path.exists():  # asked again for the same place: the same database
            shutil.copyfile(_sqlite(), path)
        return f"sqlite+aiosqlite:///{path}"
    _postgres(postgres)
    _off_loop(lambda: _create_from_template(postgres.url(), name))
    return postgres.url(name)


def _sqlite() -> Path:
    global _sqlite_template
    with _lock:
        if _sqlite_template is None:
            directory = Path(tempfile.mkdtemp(prefix="groupbuy-schema-"))
            atexit.register(shutil.rmtree, directory, ignore_errors=True)
            path = directory / "template.db"
            _off_loop(lambda: _migrate(f"sqlite+aiosqlite:///{path}"))
            _sqlite_template = path
        return _sqlite_template


def _postgres(postgres: PostgresProcess) -> None:
    with _lock:
        if postgres.port not in _postgres_templates:
            url = postgres.create_database(_TEMPLATE)
            _off_loop(lambda: _migrate(url))
            _postgres_templates.add(postgres.port)


async def _migrate(url: str) -> None:
    database = Database(url)
    try:
        await upgrade(database)
    finally:
        await database.dispose()  # no session may stay on a template that gets copied


async def _create_from_template(server_url: str, name: str) -> None:
    engine = create_async_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as connection:
            await connection.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{_TEMPLATE}"')
    finally:
        await engine.dispose()


def _off_loop(work: Callable[[], Awaitable[T]]) -> T:
    """Run `work` on an event loop of its own in another thread: the callers may be inside a
    test's running loop, or outside any."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(asyncio.run(_awaited(work)))
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


async def _awaited(work: Callable[[], Awaitable[T]]) -> T:
    return await work()
