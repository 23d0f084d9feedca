"""The ledger under concurrent transactions: entries applied once, balances equal to their sum."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime

from sqlalchemy import func, select

from groupbuy.redpacket.ledger import post_entries
from groupbuy.redpacket.models import AccountRow, LedgerEntryRow
from groupbuy.services import Services

USERS = 300
BATCHES = 8


async def test_concurrent_batches_crediting_the_same_users_in_any_order_all_commit(
    services: Services,
) -> None:
    """Several writers apply batches at once (grab credits of different packets), each
    naming the same users in its own order. On PostgreSQL each batch's balance upsert
    locks account rows one by one: batches that take them in different orders deadlock,
    and one of them is refused with 'deadlock detected' unless they all lock in one order."""
    at = datetime.now(UTC)
    users = [f"u{i:03d}" for i in range(USERS)]
    batches = []
    for batch in range(BATCHES):
        order = users[:]
        random.Random(batch).shuffle(order)
        batches.append(
            [
                {
                    "business_key": f"grab:pk{batch}:{user}",
                    "user_id": user,
                    "kind": "grab_credit",
                    "amount_cents": batch + 1,
                    "created_at": at,
                }
                for user in order
            ]
        )
    # Every account exists first, as after a first flush: later batches update rows.
    seed = [
        {**entry, "business_key": f"seed:{entry['user_id']}", "amount_cents": 0}
        for entry in batches[0]
    ]
    await apply_all(services, [seed])

    await apply_all(services, batches)

    async with services.database.sessions() as session:
        balances = dict(
            (await session.execute(select(AccountRow.user_id, AccountRow.balance_cents))).all()
        )
        entries = await session.scalar(select(func.count()).select_from(LedgerEntryRow))
    expected = sum(batch + 1 for batch in range(BATCHES))
    assert balances == {user: expected for user in users}
    assert entries == USERS * (BATCHES + 1)
    await assert_running_sums(services)


async def assert_running_sums(services: Services) -> None:
    """Each entry's balance_after_cents is the sum of its user's entries up to it (id
    order), and each user's last one is the balance."""
    async with services.database.sessions() as session:
        rows = (
            await session.execute(
                select(
                    LedgerEntryRow.user_id,
                    LedgerEntryRow.amount_cents,
                    LedgerEntryRow.balance_after_cents,
                ).order_by(LedgerEntryRow.id)
            )
        ).all()
        balances = dict(
            (await session.execute(select(AccountRow.user_id, AccountRow.balance_cents))).all()
        )
    running: dict[str, int] = {}
    for user_id, amount_cents, balance_after_cents in rows:
        running[user_id] = running.get(user_id, 0) + amount_cents
        assert balance_after_cents == running[user_id], user_id
    assert running == balances


async def apply_all(services: Services, batches: list[list[dict[str, object]]]) -> None:
    """Each batch in its own transaction, all at once."""

    async def apply(entries: list[dict[str, object]]) -> None:
        async with services.database.transaction() as session:
            await post_entries(session, entries)

    await asyncio.gather(*(apply(entries) for entries in batches))
