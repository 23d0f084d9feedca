"""The events feed's positions (groupbuy/storage/events.py), on SQLite and PostgreSQL: given
after commit, in id order, above every position given before, so a reader paging with
`after=` never misses an event that commits late."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from groupbuy import migrations
from groupbuy.redpacket.models import PacketRow
from groupbuy.redpacket.records import packet_event_key
from groupbuy.services import build_services
from groupbuy.settings import load_settings
from groupbuy.storage.db import Database
from groupbuy.storage.events import (
    SEQUENCER_LOCK,
    Event,
    EventRow,
    assign_positions,
    read_feed,
    record_event,
    record_events,
)
from tests.support.database import throwaway_postgres
from tests.support.feed import DATABASES, database_url
from tests.support.postgres import PostgresProcess
from tests.support.redis import make_async_redis
from tests.support.settings import API_KEYS

_keys = itertools.count(1)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresProcess]:
    yield from throwaway_postgres()


@pytest.fixture(params=DATABASES)
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    db = Database(database_url(str(request.param), tmp_path, request))
    await migrations.upgrade(db)
    try:
        yield db
    finally:
        await db.dispose()


def _events(count: int) -> list[Event]:
    return [Event("test.event", 1_000, f"e{next(_keys)}", {"n": i}) for i in range(count)]


async def _write(database: Database, count: int) -> None:
    async with database.transaction() as session:
        await record_events(session, _events(count))


async def _positions_by_id(database: Database) -> list[tuple[int, int | None]]:
    async with database.sessions() as session:
        return [(i, p) for i, p in await session.execute(select(EventRow.id, EventRow.position))]


async def test_positions_follow_ids_and_continue_above_the_highest(database: Database) -> None:
    await _write(database, 5)
    assert await assign_positions(database) == 5
    assert await assign_positions(database) == 0
    await _write(database, 4)
    assert await assign_positions(database, limit=3) == 3
    assert await assign_positions(database) == 1
    rows = sorted(await _positions_by_id(database))
    assert [p for _, p in rows] == list(range(1, 10))


async def test_the_feed_serves_positions_in_pages(database: Database) -> None:
    await _write(database, 7)
    first = await read_feed(database, 0, 3)
    assert [e["id"] for e in first["events"]] == [1, 2, 3]
    assert [e["data"]["n"] for e in first["events"]] == [0, 1, 2]
    assert first["next_after"] == 3
    rest = await read_feed(database, 3, 100)
    assert [e["id"] for e in rest["events"]] == [4, 5, 6, 7]
    assert await read_feed(database, 7, 100) == {"events": [], "next_after": 7}
    # Written after a read, served by the next one: the feed positions before it reads.
    await _write(database, 2)
    assert [e["id"] for e in (await read_feed(database, 7, 100))["events"]] == [8, 9]


async def test_with_nothing_waiting_the_sequencer_takes_no_lock(database: Database) -> None:
    """A read with nothing to position does not wait for another sequencer (or, on SQLite,
    for another writer): the common case of a feed read costs one index probe."""
    await _write(database, 2)
    await assign_positions(database)
    async with database.engine.connect() as holder:
        if database.is_sqlite:
            await holder.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            await holder.execute(select(func.pg_advisory_lock(SEQUENCER_LOCK)))
        try:
            page = await asyncio.wait_for(read_feed(database, 0, 10), timeout=3)
        finally:
            await holder.rollback()
            if not database.is_sqlite:
                await holder.execute(select(func.pg_advisory_unlock_all()))
    assert [e["id"] for e in page["events"]] == [1, 2]


@pytest.mark.real
async def test_an_event_committing_late_lands_after_the_readers_cursor(
    postgres: PostgresProcess, tmp_path: Path
) -> None:
    """PostgreSQL: a transaction takes id 1 and commits after one that took id 2. The reader
    who read the second must still read the first after its cursor (read by id, it could
    not: `after=2` passes id 1 for good)."""
    database = Database(postgres.create_database("late_commit"))
    await migrations.upgrade(database)
    try:
        late = database.sessions()
        await late.begin()
        await record_events(late, _events(1))  # takes id 1, not committed yet
        await _write(database, 1)  # takes id 2, committed
        first = await read_feed(database, 0, 100)
        assert [e["data"]["n"] for e in first["events"]] == [0]
        cursor = first["next_after"]
        await late.commit()
        await late.close()
        then = await read_feed(database, cursor, 100)
        assert len(then["events"]) == 1 and then["events"][0]["id"] > cursor
        ids = await _positions_by_id(database)
        assert sorted(ids) == [(1, 2), (2, 1)]  # positions in commit order, not id order
    finally:
        await database.dispose()


async def test_a_pager_misses_nothing_while_writers_and_sequencers_race(
    database: Database,
) -> None:
    """Writers commit in any order while several readers run the sequencer; one pager's
    union is the whole table in position order, nothing twice."""
    seen: list[int] = []
    done = asyncio.Event()

    async def writer(rounds: int) -> None:
        for _ in range(rounds):
            await _write(database, 3)
            await asyncio.sleep(0)

    async def pager() -> None:
        after = 0
        while True:
            finished = done.is_set()
            page = await read_feed(database, after, 7)
            seen.extend(e["id"] for e in page["events"])
            after = page["next_after"]
            if finished and not page["events"]:
                return

    async def reader() -> None:
        while not done.is_set():
            await read_feed(database, 0, 1)

    readers = [asyncio.create_task(reader()) for _ in range(3)]
    paging = asyncio.create_task(pager())
    await asyncio.gather(*(writer(20) for _ in range(6)))
    done.set()
    await asyncio.gather(paging, *readers)
    async with database.sessions() as session:
        table = list(await session.scalars(select(EventRow.position).order_by(EventRow.position)))
        unpositioned = await session.scalar(select(func.count()).where(EventRow.position.is_(None)))
    assert unpositioned == 0
    assert len(table) == 6 * 20 * 3
    assert seen == table
    assert len(set(seen)) == len(seen)
    assert table == list(range(1, len(table) + 1))


async def test_the_unpositioned_index_is_partial(database: Database) -> None:
    """The index the sequencer probes holds only the rows waiting for a position."""
    async with database.sessions() as session:
        if database.is_sqlite:
            sql = "SELECT sql FROM sqlite_master WHERE name = 'ix_events_unpositioned'"
        else:
            sql = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_events_unpositioned'"
        definition = await session.scalar(text(sql))
    assert definition is not None and "position IS NULL" in definition.replace('"', "")


@pytest.mark.real
async def test_reconciliation_scans_an_event_that_committed_late(
    postgres: PostgresProcess, tmp_path: Path
) -> None:
    """PostgreSQL: reconciliation checks what the events since its last run name. An event
    that commits after a run, with an id below the newest one that run saw, is still
    scanned by the next (with an id watermark it was passed over, and its packet, not
    otherwise touched since, went unchecked)."""
    url = postgres.create_database("reconcile_late")
    settings = load_settings(None, {"GROUPBUY_API_KEYS": API_KEYS, "GROUPBUY_DATABASE_URL": url})
    database = Database(url)
    redis = make_async_redis("")
    services = build_services(settings, redis=redis, database=database)
    await migrations.upgrade(database)
    await services.scripts.load()
    try:
        long_ago = datetime(2020, 1, 1, tzinfo=UTC)
        async with database.transaction() as session:
            session.add(
                PacketRow(
                    packet_id="late",
                    sender_id="s",
                    amount_cents=100,
                    count=1,
                    strategy="equal",
                    expires_in_s=60,
                    status="sold_out",
                    created_at=long_ago,
                    expires_at=long_ago,
                    sold_out_at=long_ago,
                    refunded_cents=0,
                    records_done=True,
                    redis_cleared=True,
                )
            )
        assert (await services.reconciler.run())["packets_checked"] == 1  # the first: all
        late = database.sessions()
        await late.begin()
        kind = "packet.sold_out"
        await record_event(late, Event(kind, 1_000, packet_event_key(kind, "late"), {}))
        async with database.transaction() as session:  # a later id, committed first
            other = packet_event_key("packet.sent", "other")
            await record_event(session, Event("packet.sent", 1_000, other, {}))
        assert (await services.reconciler.run())["packets_checked"] == 0
        await late.commit()
        await late.close()
        assert (await services.reconciler.run())["packets_checked"] == 1
    finally:
        await database.dispose()
        await redis.aclose()
