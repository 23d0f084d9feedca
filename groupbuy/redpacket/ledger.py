"""The ledger: append-only entries, each applied once, and balances kept equal to their sum
(`take_back` removes only an entry whose operation never took effect)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.redpacket.models import AccountRow, LedgerEntryRow
from groupbuy.storage.db import dialect_insert


async def post_entries(session: AsyncSession, entries: list[dict[str, Any]]) -> int:
    """Apply many entries at once, each unless its `business_key` was applied before.

    Five statements whatever the batch size: make sure each user has an account row, lock
    those rows and read their balances, insert the entries (skipping known keys), then
    write the new balances and each inserted entry's `balance_after_cents`.
    Each entry has user_id, kind, amount_cents (signed), business_key and created_at.
    Returns how many entries were applied now.
    """
    return await _apply(session, entries, require_funds=False)


async def _apply(
    session: AsyncSession, entries: list[dict[str, Any]], *, require_funds: bool
) -> int:
    if not entries:
        return 0
    users = sorted({entry["user_id"] for entry in entries})
    await session.execute(
        dialect_insert(session, AccountRow.__table__).on_conflict_do_nothing(),
        [{"user_id": user_id, "balance_cents": 0} for user_id in users],
    )
    # Locked in user order before any entry is inserted: two batches over the same users
    # cannot deadlock on PostgreSQL, and a user's entries get ids in the order their
    # balances change, so balance_after_cents is a running sum in id order.
    balances: dict[str, int] = {
        user_id: int(balance_cents)
        for user_id, balance_cents in (
            await session.execute(
                select(AccountRow.user_id, AccountRow.balance_cents)
                .where(AccountRow.user_id.in_(users))
                .order_by(AccountRow.user_id)
                .with_for_update()
            )
        ).all()
    }
    # Parameters as lists (executemany): each statement compiles once and is cached.
    inserted = sorted(
        (
            await session.execute(
                dialect_insert(session, LedgerEntryRow.__table__)
                .on_conflict_do_nothing()
                .returning(LedgerEntryRow.id, LedgerEntryRow.user_id, LedgerEntryRow.amount_cents),
                entries,
            )
        ).all()
    )
    if not inserted:
        return 0
    afters = []
    for entry_id, user_id, amount_cents in inserted:
        balances[user_id] += amount_cents
        if require_funds and balances[user_id] < 0:
            raise errors.InsufficientFunds(
                f"user {user_id!r} has less than {-amount_cents} cents", user_id=user_id
            )
        afters.append({"id": entry_id, "balance_after_cents": balances[user_id]})
    changed = sorted({user_id for _id, user_id, _amount in inserted})
    # ORM bulk updates by primary key: one executemany statement each.
    await session.execute(
        update(AccountRow),
        [{"user_id": user_id, "balance_cents": balances[user_id]} for user_id in changed],
    )
    await session.execute(update(LedgerEntryRow), afters)
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
    InsufficientFunds (the caller's transaction then rolls the entry back). The account
    row is locked before the check, so concurrent debits can never both pass it.
    """
    entry = {
        "business_key": business_key,
        "user_id": user_id,
        "kind": kind,
        "amount_cents": amount_cents,
        "created_at": at,
    }
    return await _apply(session, [entry], require_funds=require_funds) == 1


async def take_back(session: AsyncSession, business_key: str) -> bool:
    """Remove an entry and its effect on the balance, as if it had never been posted; only
    for an entry whose operation never took effect outside this database (a send whose
    packet Redis refused). True if there was one."""
    removed = (
        await session.execute(
            delete(LedgerEntryRow)
            .where(LedgerEntryRow.business_key == business_key)
            .returning(LedgerEntryRow.id, LedgerEntryRow.user_id, LedgerEntryRow.amount_cents)
        )
    ).first()
    if removed is None:
        return False
    await session.execute(
        update(AccountRow)
        .where(AccountRow.user_id == removed.user_id)
        .values(balance_cents=AccountRow.balance_cents - removed.amount_cents)
    )
    # Entries applied after it counted it in their balance after: keep the running sum.
    await session.execute(
        update(LedgerEntryRow)
        .where(LedgerEntryRow.user_id == removed.user_id, LedgerEntryRow.id > removed.id)
        .values(balance_after_cents=LedgerEntryRow.balance_after_cents - removed.amount_cents)
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
