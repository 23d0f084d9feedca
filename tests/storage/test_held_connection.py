"""Database.held (SQLite and PostgreSQL): transactions on one kept connection commit as
Database.transaction does, run their commit listeners, and a failed one drops the
connection so that the next starts on a fresh one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import func, select

from groupbuy.migrations import upgrade
from groupbuy.storage.db import Database
from groupbuy.storage.events import FEED_COMMITTED, Event, EventRow, record_events


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    await upgrade(database)
    try:
        yield database
    finally:
        await database.dispose()


async def count(db: Database) -> int:
    async with db.sessions() as session:
        return int(await session.scalar(select(func.count()).select_from(EventRow)) or 0)


def event(n: int) -> Event:
    return Event("team.formed", n, f"held:{n}", {"team_id": f"t{n}"})


async def test_a_held_connection_commits_and_survives_a_failed_transaction(db: Database) -> None:
    held = db.held()
    woken: list[int] = []
    db.on_commit(FEED_COMMITTED, lambda: woken.append(1))
    try:
        async with held.transaction() as session:
            await record_events(session, [event(1)])
        first = held._connection
        async with held.transaction() as session:
            await record_events(session, [event(2)])
        assert held._connection is first  # kept: no checkout between transactions
        assert await count(db) == 2 and woken == [1, 1]
        with pytest.raises(RuntimeError):
            async with held.transaction() as session:
                await record_events(session, [event(3)])
                raise RuntimeError("fails midway")
        assert held._connection is None and await count(db) == 2  # rolled back, dropped
        async with held.transaction() as session:
            await record_events(session, [event(4)])
        assert await count(db) == 3 and woken == [1, 1, 1]
    finally:
        await held.close()
    assert held._connection is None
