"""The ledger: append-only entries, each applied once, and balances kept equal to their sum
(`take_back` removes only an entry whose operation never took effect)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.redpacket.models import AccountRow, LedgerEntryRow
from groupbuy.storage.db import dialect_insert, insert_ignore


async def post_entries(session: AsyncSession, entries: list[dict[str, Any]]) -> int:
    """Apply many entries at once, each unless its `business_key` was applied before.

    Three statements whatever the batch size: insert the entries (skipping known keys),
    then add what was really inserted to each balance with one multi-row upsert.
    Each entry has user_id, kind, amount_cents (signed), business_key and created_at.
    Returns how many entries were applied now.
    """
    if not entries:
        return 0
    # Parameters as lists (executemany): each statement compiles once and is cached.
    inserted = (
        await session.execute(
            dialect_insert(session, LedgerEntryRow.__table__)
            .on_conflict_do_nothing()
            .returning(LedgerEntryRow.user_id, LedgerEntryRow.amount_cents),
            entries,
        )
    ).all()
    deltas: Counter[str] = Counter()
    for user_id, amount_cents in inserted:
        deltas[user_id] += amount_cents
    if deltas:
        # In user order: the upsert locks account rows one by one, and two batches that
        # took the same users in different orders would deadlock on PostgreSQL.
        rows = [
            {"user_id": user_id, "balance_cents": deltas[user_id]} for user_id in sorted(deltas)
        ]
        upsert = dialect_insert(session, AccountRow.__table__)
        await session.execute(
            upsert.on_conflict_do_update(
                index_elements=[AccountRow.user_id],
                set_={"balance_cents": AccountRow.balance_cents + upsert.excluded.balance_cents},
            ),
            rows,
        )
    return len(inserted)


async def post_entry(
    session: AsyncSession,
    *,
    user_id: str,
    kind: str,
    amount_cents: int,
    business_key: str,
    at: datetime,
    require_funds: bool = False,
) -> bool:
    """Apply one entry unless `business_key` was applied before; True if applied now.

    With `require_funds`, a debit that would take the balance below zero raises
    InsufficientFunds (the caller's transaction then rolls the entry back). The balance
    changes by a conditional UPDATE, so concurrent debits can never both pass the check.
    """
    entry = {
        "business_key": business_key,
        "user_id": user_id,
        "kind": kind,
        "amount_cents": amount_cents,
        "created_at": at,
    }
    if not require_funds:
        return await post_entries(session, [entry]) == 1
    if not await insert_ignore(session, LedgerEntryRow.__table__, entry):
        return False
    debit = await session.execute(
        update(AccountRow)
        .where(AccountRow.user_id == user_id, AccountRow.balance_cents >= -amount_cents)
        .values(balance_cents=AccountRow.balance_cents + amount_cents)
    )
    if cast(CursorResult[Any], debit).rowcount != 1:
        raise errors.InsufficientFunds(
            f"user {user_id!r} has less than {-amount_cents} cents", user_id=user_id
        )
    return True


async def take_back(session: AsyncSession, business_key: str) -> bool:
    """Remove an entry and its effect on the balance, as if it had never been posted; only
    for an entry whose operation never took effect outside this database (a send whose
    packet Redis refused). True if there was one."""
    removed = (
        await session.execute(
            delete(LedgerEntryRow)
            .where(LedgerEntryRow.business_key == business_key)
            .returning(LedgerEntryRow.user_id, LedgerEntryRow.amount_cents)
        )
    ).first()
    if removed is None:
        return False
    await session.execute(
        update(AccountRow)
        .where(AccountRow.user_id == removed.user_id)
        .values(balance_cents=AccountRow.balance_cents - removed.amount_cents)
    )
    return True


async def balance(session: AsyncSession, user_id: str) -> int:
    """A user's balance in cents (0 for a user never seen)."""
    value = await session.scalar(
        select(AccountRow.balance_cents).where(AccountRow.user_id == user_id)
    )
    return int(value or 0)


async def entry(session: AsyncSession, business_key: str) -> LedgerEntryRow | None:
    """The entry applied under a business key, if any."""
    return await session.scalar(
        select(LedgerEntryRow).where(LedgerEntryRow.business_key == business_key)
    )
