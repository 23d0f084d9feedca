"""Keyset pages newest first by an increasing id: bounded work whatever the table's size."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select

from groupbuy.storage.db import Database


async def newest_by_id(
    database: Database, query: Select[Any], id_column: Any, limit: int, cursor: str | None
) -> tuple[list[Any], str | None]:
    """The rows of `query` newest first by `id_column`, before `cursor` (the id of the last
    row of the previous page), at most `limit`, and the cursor of the next page (None on
    the last). One statement over an index that ends with the id."""
    query = query.order_by(id_column.desc()).limit(limit + 1)
    if cursor:
        query = query.where(id_column < int(cursor))
    async with database.sessions() as session:
        rows = list((await session.scalars(query)).all())
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, str(rows[-1].id) if more else None
