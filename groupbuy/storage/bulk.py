"""Statements the write-behind sends in bulk, as the driver takes them.

SQLAlchemy's executemany of a Core statement spends more time per row than the database:
it builds a dict per row, runs each value's bind processor, and renders RETURNING and
IN lists anew. On the write-behind's path, rows are plain tuples and the SQL text is the
driver's own, run as steps (groupbuy/storage/steps.py): one statement per table per
batch. Placeholders are written `?`, and turned into the driver's own (`$1` for asyncpg)
once per text.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from groupbuy_client.wire import from_ms
from sqlalchemy import ColumnElement, DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncSession

_PLACEHOLDER = re.compile(r"\?")


@lru_cache(maxsize=256)
def in_paramstyle(sql: str, paramstyle: str) -> str:
    """`sql` with its `?` placeholders in the driver's style (qmark or numeric_dollar)."""
    if paramstyle == "qmark":
        return sql
    if paramstyle != "numeric_dollar":
        raise ValueError(f"paramstyle {paramstyle!r} is not one of the databases served")
    numbers = iter(range(1, sql.count("?") + 1))
    return _PLACEHOLDER.sub(lambda _match: f"${next(numbers)}", sql)


def placeholders(count: int) -> str:
    """`?, ?, ...`: `count` placeholders for an IN list."""
    return ", ".join("?" * count)


async def dialect_of(session: AsyncSession) -> Dialect:
    """The dialect of the session's connection (the one its transaction runs on)."""
    return (await session.connection()).dialect


def bind(column: ColumnElement[Any], dialect: Dialect) -> Any:
    """The function that writes a Python value of `column` as the driver takes it (its
    type's bind processor: datetimes as text on SQLite), or `None` for no change."""
    # The dialect's own type (SQLite's DATETIME writes its text form); the generic type's
    # processor would leave the value to the driver, which writes another form.
    return column.type.dialect_impl(dialect).bind_processor(dialect)


class Moments:
    """Records' millisecond timestamps as the driver takes a timestamp column (text on
    SQLite), each distinct one converted once: a batch's records share few milliseconds."""

    def __init__(self, dialect: Dialect) -> None:
        self._bind = DateTime(timezone=True).dialect_impl(dialect).bind_processor(dialect)
        self._seen: dict[str, Any] = {}

    def __call__(self, at_ms: str) -> Any:
        value = self._seen.get(at_ms)
        if value is None:
            moment = from_ms(int(at_ms))
            value = self._seen[at_ms] = self._bind(moment) if self._bind else moment
        return value
