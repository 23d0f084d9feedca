"""Revision 0005 on a database holding ledger entries written before it, on SQLite and
PostgreSQL: each entry gets the balance after it (the running sum of its user's entries in
id order), the last one of each user equals the balance, and entries posted after the
upgrade go on from there."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from groupbuy import migrations
from groupbuy.redpacket.accounts import entries_page
from groupbuy.redpacket.ledger import post_entry
from groupbuy.redpacket.models import AccountRow, LedgerEntryRow
from groupbuy.storage.db import Database
from tests.support.database import throwaway_postgres
from tests.support.feed import DATABASES, database_url
from tests.support.postgres import PostgresProcess

WHEN = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
# (business key, user, kind, amount): interleaved users, debits among credits
OLD_ENTRIES = [
    ("deposit:r1", "s", "deposit", 1000),
    ("deposit:r2", "u1", "deposit", 50),
    ("packet_debit:p1", "s", "packet_debit", -300),
    ("grab:p1:u1", "u1", "grab_credit", 200),
    ("grab:p1:s", "s", "grab_credit", 40),
    ("refund:p1", "s", "refund_credit", 60),
]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresProcess]:
    yield from throwaway_postgres()


@pytest.fixture(params=DATABASES)
async def at_0004(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A database at revision 0004 whose ledger holds entries and balances equal to their
    sums, written through 0004's table (no balance_after_cents yet)."""
    database = Database(database_url(str(request.param), tmp_path, request))
    await migrations.upgrade(database, "0004")
    entries = sa.table(
        "ledger_entries",
        sa.column("business_key"),
        sa.column("user_id"),
        sa.column("kind"),
        sa.column("amount_cents"),
        sa.column("created_at"),
    )
    accounts = sa.table("accounts", sa.column("user_id"), sa.column("balance_cents"))
    totals: dict[str, int] = {}
    for _key, user_id, _kind, amount in OLD_ENTRIES:
        totals[user_id] = totals.get(user_id, 0) + amount
    async with database.engine.begin() as connection:
        for key, user_id, kind, amount in OLD_ENTRIES:  # one by one: ids in list order
            await connection.execute(
                entries.insert().values(
                    business_key=key,
                    user_id=user_id,
                    kind=kind,
                    amount_cents=amount,
                    created_at=WHEN,
                )
            )
        await connection.execute(
            accounts.insert(), [{"user_id": u, "balance_cents": b} for u, b in totals.items()]
        )
    try:
        yield database
    finally:
        await database.dispose()


async def test_0005_backfills_the_balance_after_each_entry(at_0004: Database) -> None:
    database = at_0004
    moved = await migrations.upgrade(database)
    assert (moved.before, moved.after) == ("0004", migrations.head())

    async with database.sessions() as session:
        rows = (
            await session.execute(
                select(LedgerEntryRow.business_key, LedgerEntryRow.balance_after_cents).order_by(
                    LedgerEntryRow.id
                )
            )
        ).all()
    assert rows == [
        ("deposit:r1", 1000),
        ("deposit:r2", 50),
        ("packet_debit:p1", 700),
        ("grab:p1:u1", 250),
        ("grab:p1:s", 740),
        ("refund:p1", 800),
    ]

    # An entry posted after the upgrade goes on from the balance.
    async with database.transaction() as session:
        assert await post_entry(
            session,
            user_id="s",
            kind="packet_debit",
            amount_cents=-500,
            business_key="packet_debit:p2",
            at=WHEN,
            require_funds=True,
        )
    async with database.sessions() as session:
        account = await session.get(AccountRow, "s")
    assert account is not None and account.balance_cents == 300

    # The account's page shows them newest first, in the API's words.
    page = await entries_page(database, "s", 3)
    assert [(e["kind"], e["amount_cents"], e["balance_after_cents"]) for e in page["entries"]] == [
        ("send", -500, 300),
        ("refund", 60, 800),
        ("grab", 40, 740),
    ]
    assert page["entries"][0]["packet_id"] == "p2"
    rest = await entries_page(database, "s", 3, page["next_cursor"])
    assert [e["kind"] for e in rest["entries"]] == ["send", "deposit"]
    assert rest["entries"][1]["reference"] == "r1" and "packet_id" not in rest["entries"][1]
    assert rest["next_cursor"] is None

    # Down and up again: the backfill gives every entry the same balance after it.
    before = await _balances_after(database)
    await migrations.downgrade(database, "0004")
    await migrations.upgrade(database)
    assert await _balances_after(database) == before


async def _balances_after(database: Database) -> list[tuple[int, int | None]]:
    async with database.sessions() as session:
        rows = await session.execute(
            select(LedgerEntryRow.id, LedgerEntryRow.balance_after_cents).order_by(
                LedgerEntryRow.id
            )
        )
        return [(entry_id, after) for entry_id, after in rows.all()]
