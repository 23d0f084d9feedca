"""AccountService: deposits and balances, in SQL's ledger."""

from __future__ import annotations

from typing import Any

from groupbuy import errors
from groupbuy.outcome import Outcome
from groupbuy.redpacket import ledger
from groupbuy.redpacket.codec import deposit_key
from groupbuy.storage.backends import UsesBackends
from groupbuy.storage.timefmt import from_ms


class AccountService(UsesBackends):
    """The accounts that packets move money between: deposits and balances."""

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
        return Outcome({"user_id": user_id, "balance_cents": balance}, applied)

    async def account(self, user_id: str) -> dict[str, Any]:
        """A user's balance (0 for an unknown user)."""
        async with self._db.sessions() as session:
            return {"user_id": user_id, "balance_cents": await ledger.balance(session, user_id)}
