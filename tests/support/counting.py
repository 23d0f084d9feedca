"""Counting what a call sends: SQL statements (engine events) and Redis commands (the
server's own counter, so pipelines and script calls count as what they are)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import event

from groupbuy.storage.db import Database


@contextlib.contextmanager
def sql_statements(database: Database) -> Iterator[list[str]]:
    """Every SQL statement the database's engine runs inside the block, in order."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement)

    engine = database.engine.sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


# Not the code's own: INFO is how the count is read, and PING is redis-py's health check of
# a connection idle for longer than its interval (a slow machine makes that happen mid-test).
NOT_COUNTED = ("cmdstat_info", "cmdstat_ping")


async def commands_processed(redis: Any) -> int:
    """How many commands the (real) server has processed so far, scripts' own included, but
    neither the INFO that reads it nor connection health checks (PING)."""
    stats = await redis.info("commandstats")
    return sum(int(calls["calls"]) for name, calls in stats.items() if name not in NOT_COUNTED)
