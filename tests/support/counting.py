"""Counting what a call sends: SQL statements (engine events) and Redis commands (the
server's own counter, so pipelines and script calls count as what they are)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import event

from groupbuy.storage import sqlite_writer
from groupbuy.storage.db import Database
from groupbuy.storage.steps import Steps

_RUNNER = "run_on_connection"


@contextlib.contextmanager
def sql_statements(database: Database) -> Iterator[list[str]]:
    """Every SQL statement the database runs inside the block, in order: its engine's, and
    on a SQLite file its writer's (groupbuy/storage/sqlite_writer.py)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement)

    # The writer calls its module's name: replaced there for the block.
    real_run = getattr(sqlite_writer, _RUNNER)

    def run_recorded(connection: Any, steps: Steps[Any]) -> Any:
        return real_run(connection, _tapped(steps, seen))

    engine = database.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    setattr(sqlite_writer, _RUNNER, run_recorded)
    try:
        yield seen
    finally:
        setattr(sqlite_writer, _RUNNER, real_run)
        event.remove(engine, "before_cursor_execute", record)


def _tapped(steps: Steps[Any], seen: list[str]) -> Steps[Any]:
    """`steps`, each statement's SQL noted in `seen` as it is run."""
    rows: Any = None
    try:
        while True:
            statement = steps.send(rows) if rows is not None else next(steps)
            seen.append(statement.sql)
            rows = yield statement
    except StopIteration as finished:
        return finished.value


# Not the code's own: INFO is how the count is read, and PING is redis-py's health check of
# a connection idle for longer than its interval (a slow machine makes that happen mid-test).
NOT_COUNTED = ("cmdstat_info", "cmdstat_ping")


async def commands_processed(redis: Any) -> int:
    """How many commands the (real) server has processed so far, scripts' own included, but
    neither the INFO that reads it nor connection health checks (PING)."""
    stats = await redis.info("commandstats")
    return sum(int(calls["calls"]) for name, calls in stats.items() if name not in NOT_COUNTED)
