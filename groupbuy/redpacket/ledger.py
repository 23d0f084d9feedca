"""The ledger: append-only entries, each applied once, and balances kept equal to their sum."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.db import insert_ignore
from groupbuy.redpacket.models import AccountRow, LedgerEntryRow


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
    applied = await insert_ignore(
        session,
        LedgerEntryRow.__table__,
        {
            "business_key": business_key,
            "user_id": user_id,
            "kind": kind,
            "amount_cents": amount_cents,
            "created_at": at,
        },
    )
    if not applied:
        return False
    if require_funds:
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
    await insert_ignore(session, AccountRow.__table__, {"user_id": user_id, "balance_cents": 0})
    await session.execute(
        update(AccountRow)
        .where(AccountRow.user_id == user_id)
        .values(balance_cents=AccountRow.balance_cents + amount_cents)
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
