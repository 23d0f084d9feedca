"""SQLAlchemy 2.x async: the declarative base, the engine and its sessions."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, TypeVar, cast

from sqlalchemy import CursorResult, event, exc, make_url, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase

from groupbuy.storage.quiet_logs import guard_driver_logs
from groupbuy.storage.reachability import Reachability
from groupbuy.storage.sqlite_writer import SQLiteWriter, sqlite_pragmas
from groupbuy.storage.steps import Steps, run_on_session
from groupbuy.storage.turns import WriterTurns

# The session.info key of the topics whose listeners run after the transaction commits.
_COMMIT_TOPICS = "groupbuy_commit_topics"
R = TypeVar("R")

# The async driver of each URL scheme the service takes, and how to install it.
_DRIVERS = {
    "sqlite+aiosqlite": ("aiosqlite", "pip install groupbuy (aiosqlite is a dependency)"),
    "postgresql+asyncpg": ("asyncpg", "pip install 'groupbuy[postgres]'"),
}


def missing_driver(url: str) -> str | None:
    """A one-line reason when the driver of the database URL `url` is not installed."""
    scheme = url.partition("://")[0].lower()
    module, install = _DRIVERS.get(scheme, ("", ""))
    if module and importlib.util.find_spec(module) is None:
        return f"the database URL {scheme}://... needs the {module} driver: {install}"
    return None


def shown_url(url: str) -> str:
    """The URL as the start-up message shows it: the password masked, a SQLite file's path
    absolute (so the operator knows which file, whatever directory they are in)."""
    try:
        parsed = make_url(url)
    except exc.ArgumentError:
        return url
    path = sqlite_path(url)
    if path is not None:
        parsed = parsed.set(database=os.path.abspath(path))
    return parsed.render_as_string(hide_password=True)


def sqlite_path(url: str) -> str | None:
    """The file a SQLite URL names, as given (relative or not); None for another database
    or an in-memory one."""
    try:
        parsed = make_url(url)
    except exc.ArgumentError:
        return None
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):  # a URI filename: left as it is
        return None
    return database


class Base(DeclarativeBase):
    """Base of every SQL model of the service."""


class DatabaseUnreachable(Exception):
    """No connection to the database could be opened (refused, reset, no route, no answer
    in time); raised from the operating system's error, which SQLAlchemy passes on bare."""


class DatabaseBusy(Exception):
    """A SQLite writer of this process did not get its turn within the timeout: the writers
    before it each waited for a write lock that another process or connection holds."""


# SQLSTATE classes of a server that cannot serve now, whatever the statement: 08 connection
# exception, 53 insufficient resources (too many connections, disk full), 57 operator
# intervention (shutting down, starting up, a statement cancelled by its timeout).
_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57")

FAILURES: tuple[type[Exception], ...] = (
    exc.DBAPIError,
    exc.TimeoutError,  # no pooled connection free within the pool's timeout
    exc.DisconnectionError,
    DatabaseUnreachable,
    DatabaseBusy,
)
"""The exception classes a database failure arrives as; `unavailable` tells which of them
mean the database cannot serve now (an error handler names these classes)."""


def unavailable(error: BaseException) -> bool:
    """Whether `error` means the database cannot serve now — down, starting up, unreachable,
    a lost connection, locked or slower than its timeout — rather than a fault of the
    statement or its values. The one judge of both the API's 503 database_unavailable and
    the write-behind's "transient, retry the batch" (groupbuy/storage/deadletters.py)."""
    if isinstance(
        error, DatabaseUnreachable | DatabaseBusy | exc.TimeoutError | exc.DisconnectionError
    ):
        return True
    if not isinstance(error, exc.DBAPIError):
        return False
    if error.connection_invalidated or isinstance(error, exc.OperationalError | exc.InterfaceError):
        return True
    # asyncpg's errors arrive as a plain DBAPIError: a connection closed under a statement
    # (ConnectionDoesNotExistError, 08003), a server starting up (CannotConnectNowError,
    # 57P03) or shutting down (AdminShutdownError, 57P01) carry their SQLSTATE.
    return any(
        isinstance(cause, OSError) or sqlstate(cause)[:2] in _UNAVAILABLE_SQLSTATE_CLASSES
        for cause in causes(error.orig)
    )


def causes(error: BaseException | None) -> list[BaseException]:
    """An exception and the chain of exceptions it was raised from."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__
    return chain


def sqlstate(error: BaseException) -> str:
    """The SQLSTATE a driver's error carries (asyncpg's do), or ''."""
    return str(getattr(error, "sqlstate", "") or "")


class Database:
    """An async engine plus a session factory (the tables come from groupbuy.migrations).

    `timeout_s` bounds how long a call waits for the database: on SQLite for its turn among
    this process's writers, then for the file's write lock (the busy timeout); on
    PostgreSQL for a connection (opening one, or one from the pool). Past it the call
    fails as `unavailable` (503 database_unavailable in the API).
    """

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.is_sqlite = url.startswith("sqlite")
        # Says once per outage that the database is away, and once that it is back (after
        # a commit): not a line per failed call.
        self.reachability = Reachability(shown_url(url), what="database", judge=unavailable)
        options: dict[str, Any] = {
            "pool_pre_ping": True,
            "pool_timeout": timeout_s,
            # sqlite3's busy timeout; asyncpg's connect timeout
            "connect_args": {"timeout": timeout_s},
            # Parameters carry webhook secrets: no log line or error text may show them,
            # even with SQLAlchemy's logging at DEBUG.
            "hide_parameters": True,
        }
        guard_driver_logs()
        self.engine: AsyncEngine = create_async_engine(url, **options)
        event.listen(self.engine.sync_engine, "do_connect", _connect)
        if self.is_sqlite:
            busy_timeout_ms = round(timeout_s * 1000)
            event.listen(
                self.engine.sync_engine,
                "connect",
                lambda connection, _record: sqlite_pragmas(connection, busy_timeout_ms),
            )
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        # SQLite takes one writer at a time; a second one waits in its busy handler, which
        # sleeps in steps of up to 100 ms. Queueing this process's writers here instead
        # hands the lock over at once (a confirm behind the write-behind no longer waits
        # out the handler's sleeps), urgent ones first (groupbuy/storage/turns.py).
        # Other processes still meet the busy handler.
        self._writers = WriterTurns() if self.is_sqlite else None
        # Stepped transactions on a SQLite file: a hop between threads per statement is most
        # of their time through the pool (groupbuy/storage/sqlite_writer.py).
        path = sqlite_path(url)
        self._bulk = SQLiteWriter(path, timeout_s) if path is not None else None
        # Called after a transaction that marked their topic commits (mark_committing).
        self._listeners: dict[str, list[Callable[[], None]]] = {}

    def on_commit(self, topic: str, listener: Callable[[], None]) -> None:
        """Call `listener` after each of this process's transactions that marked `topic`
        commits (it runs in the committing task: it must be quick and must not raise)."""
        self._listeners.setdefault(topic, []).append(listener)

    def off_commit(self, topic: str, listener: Callable[[], None]) -> None:
        """Stop calling a listener given to on_commit."""
        listeners = self._listeners.get(topic, [])
        if listener in listeners:
            listeners.remove(listener)

    @asynccontextmanager
    async def transaction(self, urgent: bool = False) -> AsyncIterator[AsyncSession]:
        """A session inside one transaction, committed on success (never nest them). An
        `urgent` one (an answer waits on it) goes before the other writers waiting on
        SQLite."""
        async with self._turn(urgent), self.sessions() as session, session.begin():
            yield session
        self._committed(session)

    def _committed(self, session: AsyncSession) -> None:
        self.reachability.answered()  # committed: the database takes writes (again)
        self._notify(session.info.pop(_COMMIT_TOPICS, ()))

    def _notify(self, topics: Iterable[str]) -> None:
        for topic in topics:
            for listener in list(self._listeners.get(topic, ())):
                listener()

    async def run_steps(
        self,
        steps: Callable[[], Steps[R]],
        urgent: bool = False,
        topics: tuple[str, ...] = (),
        records: int = 0,
    ) -> R:
        """Run a stepped transaction (groupbuy/storage/steps.py) and commit it: on a SQLite
        file by its writer, in one call, during this process's writer turn
        (`urgent`: as `transaction`'s); elsewhere on a pooled connection. The on_commit
        listeners of `topics` are called once it commits (as mark_committing does).
        `records`: how many records it writes (a big batch runs off the event loop)."""
        if self._bulk is None:
            async with self.transaction(urgent) as session:
                for topic in topics:
                    mark_committing(session, topic)
                return await run_on_session(session, steps())
        async with self._turn(urgent):
            result = await self._bulk.transaction(steps, records)
        self.reachability.answered()
        self._notify(topics)
        return result

    def held(self) -> HeldConnection:
        """One connection kept across transactions, for a loop that writes often."""
        return HeldConnection(self)

    @asynccontextmanager
    async def _turn(self, urgent: bool) -> AsyncIterator[None]:
        """This process's turn to write (SQLite), waited for at most `timeout_s`: while
        another process holds the file's lock, each writer in the queue waits out its busy
        timeout in turn, and without a bound the last would wait for all of them."""
        if self._writers is None:
            yield
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._writers.acquire(urgent)
        except TimeoutError:
            raise DatabaseBusy(
                f"no turn to write within {self.timeout_s:g} s: the writers before this one "
                "are waiting for SQLite's write lock"
            ) from None
        try:
            yield
        finally:
            self._writers.release()

    async def ping(self) -> None:
        """Raise unless the database answers."""
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        """Close every pooled connection, and the SQLite writer's."""
        if self._bulk is not None:
            await self._bulk.close()
        await self.engine.dispose()


class HeldConnection:
    """One connection of a Database's pool kept across its transactions: a checkout pings
    the connection first (`pool_pre_ping`: three round trips on asyncpg, BEGIN, a query,
    ROLLBACK), which a loop that writes several times a second pays once instead. A
    transaction that fails drops the connection; the next one checks out a fresh one, pinged.
    Its transactions run one at a time; close() gives the connection back."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._connection: AsyncConnection | None = None
        self._one_at_a_time = asyncio.Lock()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """As Database.transaction, on the held connection."""
        async with self._one_at_a_time, self._db._turn(urgent=False), self._session() as session:
            yield session
        self._db._committed(session)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncSession]:
        """A transaction on the held connection that only reads: on SQLite it does not wait
        for this process's turn to write (a read takes no write lock)."""
        async with self._one_at_a_time, self._session() as session:
            yield session

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[AsyncSession]:
        if self._connection is None:
            self._connection = await self._db.engine.connect()
        try:
            async with (
                AsyncSession(bind=self._connection, expire_on_commit=False) as session,
                session.begin(),
            ):
                yield session
        except BaseException:
            # Whatever failed may have been the connection itself.
            await self.close()
            raise

    async def close(self) -> None:
        """Give the connection back to the pool (a later transaction takes another)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):  # a broken one is discarded by the pool
                await connection.close()


def mark_committing(session: AsyncSession, topic: str) -> None:
    """Have the on_commit listeners of `topic` called once this session's transaction
    (a Database.transaction) commits."""
    session.info.setdefault(_COMMIT_TOPICS, set()).add(topic)


def _connect(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
    # SQLAlchemy wraps the driver's own errors (DBAPIError); an OSError from opening the
    # socket (refused, reset, no route, asyncpg's connect timeout) it passes on bare, where
    # it could not be told from any other OSError. Named here, where it is certain.
    try:
        return dialect.connect(*cargs, **cparams)
    except OSError as error:
        raise DatabaseUnreachable(str(error) or type(error).__name__) from error


def dialect_insert(session: AsyncSession, table: Any) -> Any:
    """An INSERT of the session's dialect, which knows ON CONFLICT (SQLite and PostgreSQL)."""
    return named_dialect_insert(session.get_bind().dialect.name, table)


def named_dialect_insert(dialect_name: str, table: Any) -> Any:
    """An INSERT of the dialect so named, which knows ON CONFLICT."""
    dialect = postgresql if dialect_name == "postgresql" else sqlite
    return dialect.insert(table)


async def insert_ignore(session: AsyncSession, table: Any, values: dict[str, Any]) -> bool:
    """INSERT a row unless its unique key exists (ON CONFLICT DO NOTHING); True if inserted."""
    statement = dialect_insert(session, table).values(**values).on_conflict_do_nothing()
    result = await session.execute(statement)
    return bool(cast(CursorResult[Any], result).rowcount)
