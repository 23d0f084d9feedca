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


async def commands_processed(redis: Any) -> int:
    """How many commands the (real) server has processed so far; reading it is one more."""
    return int((await redis.info("stats"))["total_commands_processed"])
