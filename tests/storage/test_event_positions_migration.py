"""Revision 0002 (events get feed positions) on a database holding data at 0001, on SQLite
and PostgreSQL: everything stays readable, the feed serves the old events in their order
with their old ids (so cursors readers hold stay valid), and new events after them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import MetaData, delete, func, select

from groupbuy import migrations
from groupbuy.redpacket.models import AccountRow, GrabRow, LedgerEntryRow, PacketRow
from groupbuy.services import build_services
from groupbuy.settings import load_settings
from groupbuy.storage.db import Database
from groupbuy.storage.events import Event, EventRow, read_feed, record_events
from tests.support.database import throwaway_postgres
from tests.support.feed import DATABASES, database_url
from tests.support.postgres import PostgresProcess
from tests.support.redis import make_async_redis
from tests.support.settings import API_KEYS

WHEN = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
OLD_EVENTS = 12


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresProcess]:
    yield from throwaway_postgres()


@pytest.fixture(params=DATABASES)
async def at_0001(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A database at revision 0001 holding packets, grabs, ledger entries, accounts and
    events, written through 0001's own tables (the models have moved on)."""
    database = Database(database_url(str(request.param), tmp_path, request))
    await migrations.upgrade(database, "0001")
    tables = _baseline().tables
    async with database.engine.begin() as connection:
        await connection.execute(
            tables["accounts"].insert(),
            [{"user_id": "s", "balance_cents": 700}, {"user_id": "u1", "balance_cents": 200}],
        )
        await connection.execute(
            tables["packets"].insert(),
            [
                {
                    "packet_id": "p1",
                    "sender_id": "s",
                    "amount_cents": 300,
                    "count": 2,
                    "strategy": "equal",
                    "expires_in_s": 60,
                    "status": "sold_out",
                    "created_at": WHEN,
                    "expires_at": WHEN,
                    "sold_out_at": WHEN,
                    "expired_at": None,
                    "refunded_cents": 0,
                    "records_done": True,
                    "redis_cleared": True,
                }
            ],
        )
        await connection.execute(
            tables["grabs"].insert(),
            [
                {
                    "packet_id": "p1",
                    "user_id": "u1",
                    "seq": 1,
                    "amount_cents": 200,
                    "grabbed_at": WHEN,
                },
                {
                    "packet_id": "p1",
                    "user_id": "u2",
                    "seq": 2,
                    "amount_cents": 100,
                    "grabbed_at": WHEN,
                },
            ],
        )
        await connection.execute(
            tables["ledger_entries"].insert(),
            [
                {
                    "business_key": "deposit:r1",
                    "user_id": "s",
                    "kind": "deposit",
                    "amount_cents": 1000,
                    "created_at": WHEN,
                },
                {
                    "business_key": "packet_debit:p1",
                    "user_id": "s",
                    "kind": "packet_debit",
                    "amount_cents": -300,
                    "created_at": WHEN,
                },
                {
                    "business_key": "grab:p1:u1",
                    "user_id": "u1",
                    "kind": "grab_credit",
                    "amount_cents": 200,
                    "created_at": WHEN,
                },
            ],
        )
        await connection.execute(
            tables["events"].insert(),
            [
                {
                    "type": "test.old",
                    "at": WHEN,
                    "dedup_key": f"old:{n}",
                    "data": json.dumps({"n": n}),
                }
                for n in range(OLD_EVENTS)
            ],
        )
        # A hole in the ids, as a rolled-back transaction leaves on PostgreSQL.
        await connection.execute(
            delete(tables["events"]).where(tables["events"].c.dedup_key == "old:4")
        )
    try:
        yield database
    finally:
        await database.dispose()


def _baseline() -> MetaData:
    module = migrations.scripts().get_revision("0001").module
    metadata: MetaData = module.schema()
    return metadata


async def test_0002_keeps_the_data_and_the_ids_readers_hold(at_0001: Database) -> None:
    database = at_0001
    async with database.engine.connect() as connection:
        old_ids = [
            i
            for (i,) in await connection.execute(
                select(_baseline().tables["events"].c.id).order_by(
                    _baseline().tables["events"].c.id
                )
            )
        ]
    assert len(old_ids) == OLD_EVENTS - 1

    moved = await migrations.upgrade(database)
    assert (moved.before, moved.after) == ("0001", migrations.head())

    async with database.sessions() as session:
        packet = await session.get(PacketRow, "p1")
        assert packet is not None and packet.status == "sold_out" and packet.amount_cents == 300
        grabs = (await session.scalars(select(GrabRow).order_by(GrabRow.seq))).all()
        assert [(g.user_id, g.amount_cents) for g in grabs] == [("u1", 200), ("u2", 100)]
        assert await session.scalar(select(func.sum(LedgerEntryRow.amount_cents))) == 900
        assert await session.scalar(select(func.count()).select_from(AccountRow)) == 2
        positions = (await session.execute(select(EventRow.id, EventRow.position))).all()
        assert all(position == event_id for event_id, position in positions)

    # The feed: the old events in their order under their old ids.
    page = await read_feed(database, 0, 1000)
    assert [e["id"] for e in page["events"]] == old_ids
    assert [e["data"]["n"] for e in page["events"]] == [n for n in range(OLD_EVENTS) if n != 4]
    # A reader whose cursor is an old id goes on from there.
    held = old_ids[5]
    resumed = await read_feed(database, held, 1000)
    assert [e["id"] for e in resumed["events"]] == old_ids[6:]

    # New events come after every old one, in order, and nothing is served twice.
    async with database.transaction() as session:
        await record_events(
            session, [Event("test.new", 1_000, f"new:{n}", {"n": n}) for n in range(3)]
        )
    after = await read_feed(database, page["next_after"], 1000)
    new_ids = [e["id"] for e in after["events"]]
    assert [e["type"] for e in after["events"]] == ["test.new"] * 3
    assert new_ids == sorted(new_ids) and new_ids[0] > old_ids[-1]

    # Reconciliation reads every table the upgrade touched (and the rest) without failing.
    settings = load_settings(
        None, {"GROUPBUY_API_KEYS": API_KEYS, "GROUPBUY_DATABASE_URL": database.url}
    )
    redis = make_async_redis("")
    try:
        services = build_services(settings, redis=redis, database=database)
        await services.scripts.load()
        report = await services.reconciler.run()
    finally:
        await redis.aclose()
    assert report["packets_checked"] == 1
