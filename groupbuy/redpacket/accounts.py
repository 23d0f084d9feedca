"""AccountService: deposits, balances and ledger entries, in SQL's ledger."""

from __future__ import annotations

from typing import cast

from groupbuy_client import wire
from groupbuy_client.wire import Outcome, from_ms, iso_ms, to_ms
from sqlalchemy import select

from groupbuy import errors
from groupbuy.redpacket import ledger
from groupbuy.redpacket.codec import BusinessKey, deposit_key, parse_business_key
from groupbuy.redpacket.models import LedgerEntryRow
from groupbuy.storage.backends import UsesBackends
from groupbuy.storage.db import Database
from groupbuy.storage.paging import newest_by_id

# The ledger's kinds -> the words of the API (SPEC §3, accounts).
ENTRY_KINDS = {
    "deposit": "deposit",
    "packet_debit": "send",
    "grab_credit": "grab",
    "refund_credit": "refund",
}


class AccountService(UsesBackends):
    """The accounts that packets move money between: deposits, balances, entries."""

    async def deposit(self, user_id: str, amount_cents: int, reference: str) -> Outcome:
        """Credit a user once per reference; the same reference again returns the balance."""
        at = from_ms(await self._clock.now_ms(self._redis))
        async with self._db.transaction(urgent=True) as session:
            applied = await ledger.post_entry(
                session,
                user_id=user_id,
                kind="deposit",
                amount_cents=amount_cents,
                business_key=deposit_key(reference),
                at=at,
            )
            if not applied:
                earlier = await ledger.entry(session, deposit_key(reference))
                assert earlier is not None
                if (earlier.user_id, earlier.amount_cents) != (user_id, amount_cents):
                    raise errors.Conflict(
                        f"reference {reference!r} was used for another deposit", reference=reference
                    )
            balance = await ledger.balance(session, user_id)
        return Outcome(dict(account_body(user_id, balance)), applied)

    async def account(self, user_id: str) -> wire.Account:
        """A user's balance (0 for an unknown user)."""
        async with self._db.sessions() as session:
            return account_body(user_id, await ledger.balance(session, user_id))

    async def entries(
        self, user_id: str, limit: int, cursor: str | None = None
    ) -> wire.LedgerEntriesPage:
        """A user's ledger entries newest first (entries_page)."""
        return await entries_page(self._db, user_id, limit, cursor)


def account_body(user_id: str, balance_cents: int) -> wire.Account:
    """A user's balance as the API shows it."""
    return {"user_id": user_id, "balance_cents": balance_cents}


async def entries_page(
    database: Database, user_id: str, limit: int, cursor: str | None = None
) -> wire.LedgerEntriesPage:
    """A user's ledger entries newest first (by id), after `cursor` (the id of the last entry
    of the previous page): one statement over the (user_id, id) index."""
    query = select(LedgerEntryRow).where(LedgerEntryRow.user_id == user_id)
    rows, next_cursor = await newest_by_id(database, query, LedgerEntryRow.id, limit, cursor)
    return {"entries": [entry_body(row) for row in rows], "next_cursor": next_cursor}


def entry_body(row: LedgerEntryRow) -> wire.LedgerEntry:
    """A ledger entry as the API shows it: its kind in SPEC's words, what it names."""
    try:
        key = parse_business_key(row.business_key)
    except ValueError:  # not written by this service's code: shown as it is
        key = BusinessKey(row.kind)
    body: wire.LedgerEntry = {
        "kind": cast(wire.EntryKind, ENTRY_KINDS.get(row.kind, row.kind)),
        "amount_cents": row.amount_cents,
        # set when the entry is applied (revision 0005 filled in the entries before it)
        "balance_after_cents": cast(int, row.balance_after_cents),
        "reference": key.reference if key.reference is not None else row.business_key,
        "at": iso_ms(to_ms(row.created_at)),
    }
    if key.packet_id is not None:
        body["packet_id"] = key.packet_id
    return body
