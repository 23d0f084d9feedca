"""The ledger: append-only entries, each applied once, and balances kept equal to their sum
(`take_back` removes only an entry whose operation never took effect)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.redpacket.models import AccountRow, LedgerEntryRow
from groupbuy.storage.bulk import bind, dialect_of, placeholders
from groupbuy.storage.db import dialect_insert
from groupbuy.storage.steps import Statement, Steps, inserting, run_on_session


async def post_entries(session: AsyncSession, entries: list[dict[str, Any]]) -> int:
    """Apply many entries at once, each unless its `business_key` was applied before.

    Five statements whatever the batch size: make sure each user has an account row, lock
    those rows and read their balances, find the keys applied before, insert the new
    entries with their `balance_after_cents`, then write the new balances. A batch (the
    write-behind's credits) sends them as driver SQL (`entry_steps`), 1.6x as fast on
    SQLite as through SQLAlchemy's statements (docs/benchmarks-findings.md).
    Each entry has user_id, kind, amount_cents (signed), business_key and created_at.
    Returns how many entries were applied now.
    """
    return await _apply(session, entries, require_funds=False)


async def _apply(
    session: AsyncSession, entries: list[dict[str, Any]], *, require_funds: bool
) -> int:
    if not entries:
        return 0
    if len(entries) > 1 and not require_funds:
        dialect = await dialect_of(session)
        created_at = bind(LedgerEntryRow.__table__.c.created_at, dialect)
        batch = [entry_of(entry, created_at) for entry in entries]
        return await run_on_session(session, entry_steps(batch, dialect.name == "postgresql"))
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
    # The rows are locked: no other transaction can apply an entry of these users now, so
    # the keys applied before are known here and each new entry's balance after it can be
    # written by its INSERT (no second pass over the entries).
    known = set(
        await session.scalars(
            select(LedgerEntryRow.business_key).where(
                LedgerEntryRow.business_key.in_({entry["business_key"] for entry in entries})
            )
        )
    )
    fresh = []
    for entry in entries:
        if entry["business_key"] in known:
            continue
        known.add(entry["business_key"])
        user_id = entry["user_id"]
        balances[user_id] += entry["amount_cents"]
        if require_funds and balances[user_id] < 0:
            raise errors.InsufficientFunds(
                f"user {user_id!r} has less than {-entry['amount_cents']} cents", user_id=user_id
            )
        fresh.append({**entry, "balance_after_cents": balances[user_id]})
    if not fresh:
        return 0
    # Parameters as lists (executemany): each statement compiles once and is cached.
    inserted = (
        await session.execute(
            dialect_insert(session, LedgerEntryRow.__table__)
            .on_conflict_do_nothing()
            .returning(LedgerEntryRow.business_key),
            fresh,
        )
    ).all()
    if len(inserted) != len(fresh):
        # Only a key that does not name its user (a deposit's reference) can be taken by
        # another user's transaction meanwhile; deposits post one entry, which did not apply.
        if len(fresh) == 1:
            return 0
        raise RuntimeError("ledger keys were applied concurrently for other users")
    changed = sorted({entry["user_id"] for entry in fresh})
    # An upsert rather than an UPDATE per row: SQLAlchemy sends the rows of an INSERT
    # as a few multi-row statements (every account exists and is locked by now).
    upsert = dialect_insert(session, AccountRow.__table__)
    await session.execute(
        upsert.on_conflict_do_update(
            index_elements=[AccountRow.user_id],
            set_={"balance_cents": upsert.excluded.balance_cents},
        ),
        [{"user_id": user_id, "balance_cents": balances[user_id]} for user_id in changed],
    )
    return len(fresh)


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


_NEW_ACCOUNTS = "INSERT INTO accounts (user_id, balance_cents)"
_NO_ACCOUNT_TWICE = " ON CONFLICT DO NOTHING"
_NEW_ENTRIES = (
    "INSERT INTO ledger_entries (business_key, user_id, kind, amount_cents, "
    "balance_after_cents, created_at)"
)
# Every account exists and is locked by now: the upsert only sets the new balances, in
# one statement (an UPDATE would take one execution per account).
_NEW_BALANCES = "INSERT INTO accounts (user_id, balance_cents)"
_SET_BALANCE = " ON CONFLICT (user_id) DO UPDATE SET balance_cents = excluded.balance_cents"

Entry = tuple[str, str, str, int, Any]
"""A ledger entry of a batch, as the driver takes it: (business_key, user_id, kind,
amount_cents, created_at in the driver's form: see groupbuy/storage/bulk.py `bind`)."""


def entry_of(entry: dict[str, Any], created_at: Callable[[Any], Any] | None) -> Entry:
    """An entry given as a dict (post_entries') as the tuple `entry_steps` takes."""
    created = entry["created_at"]
    return (
        entry["business_key"],
        entry["user_id"],
        entry["kind"],
        entry["amount_cents"],
        created_at(created) if created_at else created,
    )


def entry_steps(entries: Sequence[Entry], postgresql: bool) -> Steps[int]:
    """`_apply` of a batch without `require_funds` (the write-behind's credits), as steps
    (groupbuy/storage/steps.py): five statements whatever the batch's size (up to the
    values limit), no row built as a dict or an object on the way. Returns how many
    entries were applied now."""
    users = sorted({entry[1] for entry in entries})
    yield from inserting(_NEW_ACCOUNTS, [(user_id, 0) for user_id in users], _NO_ACCOUNT_TWICE)
    # Locked in user order (PostgreSQL), as _apply does: see there.
    lock = " FOR UPDATE" if postgresql else ""
    held = yield Statement(
        f"SELECT user_id, balance_cents FROM accounts WHERE user_id IN "
        f"({placeholders(len(users))}) ORDER BY user_id{lock}",
        users,
    )
    balances = {user_id: int(cents) for user_id, cents in held}
    keys = list({entry[0] for entry in entries})
    applied = yield Statement(
        f"SELECT business_key FROM ledger_entries WHERE business_key IN "
        f"({placeholders(len(keys))})",
        keys,
    )
    known = {key for (key,) in applied}
    fresh = []
    for key, user_id, kind, cents, created in entries:
        if key in known:
            continue
        known.add(key)
        balances[user_id] += cents
        fresh.append((key, user_id, kind, cents, balances[user_id], created))
    if not fresh:
        return 0
    # A plain INSERT: the accounts are locked and these keys were not there. A key taken
    # meanwhile (a deposit's, by another user's transaction) fails the batch; the
    # write-behind then splits it, and an entry alone takes `_apply`'s one-entry path.
    yield from inserting(_NEW_ENTRIES, fresh)
    changed = sorted({row[1] for row in fresh})
    yield from inserting(_NEW_BALANCES, [(u, balances[u]) for u in changed], _SET_BALANCE)
    return len(fresh)
