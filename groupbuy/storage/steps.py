"""A transaction's statements written once as steps, run on either database.

The write-behind's batches are a few statements whose later ones depend on the rows of
earlier ones (the balances a ledger entry adds to). Written as a generator, such a
transaction yields each `Statement` and receives its rows, and says nothing of how they
are sent. Two runners drive it:

- `run_on_session`: statement by statement on an AsyncSession's connection (PostgreSQL,
  and SQLite where the batch shares a transaction with ORM work);
- `run_on_connection`: all at once on a plain sqlite3 connection, in one call on the
  event loop's thread (groupbuy/storage/sqlite_writer.py): no hop between threads, where
  the pool would make one per statement.

The SQL is the driver's own (groupbuy/storage/bulk.py): `?` placeholders, tuples of values.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.storage.bulk import in_paramstyle

R = TypeVar("R")
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True)
class Statement:
    """One statement of a stepped transaction: its SQL and its values; with `many`, the
    values are a sequence of rows and the statement runs once per row (no rows back)."""

    sql: str
    values: Sequence[Any] = ()
    many: bool = False


Steps = Generator[Statement, Rows, R]
"""A transaction as steps: yields statements, is sent each one's rows, returns its result."""

# Values one statement carries at most: under both databases' limits (SQLite 32,766
# variables, PostgreSQL 32,767 parameters), so a batch of the largest size the settings
# allow goes in a few statements.
MAX_VALUES = 30_000


def inserting(head: str, rows: Sequence[tuple[Any, ...]], tail: str = "") -> Iterator[Statement]:
    """`head VALUES (?, ...), (?, ...) tail`: `rows` in as few statements as the values
    limit allows, rather than one execution per row.

    Each execution of a statement is a step of the driver, and sqlite3 gives up the GIL
    around each one: under a busy event loop the writer thread then waits for the GIL
    once per row (docs/benchmarks-findings.md), and once per statement here."""
    if not rows:
        return
    width = len(rows[0])
    per_statement = MAX_VALUES // width
    for start in range(0, len(rows), per_statement):
        chunk = rows[start : start + per_statement]
        sql = _values_sql(head, width, len(chunk), tail)
        yield Statement(sql, [value for row in chunk for value in row])


@lru_cache(maxsize=64)
def _values_sql(head: str, width: int, count: int, tail: str) -> str:
    row = f"({', '.join('?' * width)})"
    return f"{head} VALUES {', '.join([row] * count)}{tail}"


async def run_on_session(session: AsyncSession, steps: Steps[R]) -> R:
    """Run `steps` in the session's transaction, one statement at a time."""
    connection = await session.connection()
    paramstyle = connection.dialect.paramstyle
    rows: Rows | None = None
    try:
        while True:
            statement = steps.send(rows) if rows is not None else next(steps)
            sql = in_paramstyle(statement.sql, paramstyle)
            if statement.many:
                rows = []
                if statement.values:
                    await connection.exec_driver_sql(sql, list(statement.values))
            else:
                result = await connection.exec_driver_sql(sql, tuple(statement.values))
                rows = [tuple(row) for row in result.all()] if result.returns_rows else []
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]


def run_on_connection(connection: sqlite3.Connection, steps: Steps[R]) -> R:
    """Run `steps` on a sqlite3 connection, in the calling thread (the connection's own)."""
    rows: Rows | None = None
    try:
        while True:
            statement = steps.send(rows) if rows is not None else next(steps)
            if statement.many:
                rows = []
                if statement.values:
                    connection.executemany(statement.sql, statement.values)
            else:
                rows = connection.execute(statement.sql, tuple(statement.values)).fetchall()
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
