"""The confirm mix's ledger watch (benchmarks/confirm_mix.py): a credit committed out of id
order (writers side by side) is still timed when it shows, not passed over."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import insert

from benchmarks.confirm_mix import LedgerWatch
from groupbuy.redpacket.models import LedgerEntryRow
from groupbuy.storage.db import Database

AT = datetime(2026, 12, 3, 6, 0, tzinfo=UTC)


async def _entry(db: Database, entry_id: int) -> None:
    async with db.transaction() as session:
        await session.execute(insert(LedgerEntryRow).values(id=entry_id,
            business_key=f"k{entry_id}", user_id="u", kind="grab_credit", amount_cents=1,
            created_at=AT, balance_after_cents=1))  # fmt: skip


async def test_an_entry_committed_after_a_higher_id_is_seen(db: Database) -> None:
    watch = LedgerWatch(db.url)
    try:
        async with watch._engine.connect() as connection:
            await _entry(db, 1)
            await watch.poll(connection)
            await _entry(db, 3)  # id 2 is still uncommitted: a gap
            await watch.poll(connection)
            assert set(watch.seen) == {"k1", "k3"}
            await _entry(db, 2)
            await watch.poll(connection)
            assert set(watch.seen) == {"k1", "k2", "k3"}
    finally:
        await watch._engine.dispose()
