"""The seat-lock side of the sale: shoppers arrive, join a team (or open one), then pay,
unlock or let the lock expire; when the stock is held they wait in line for an offer, and
the shop restocks a sold-out sale that has a line."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from groupbuy_client import GroupBuyAPIError, GroupBuyClient, GroupBuyTransportError
from groupbuy_client.wire import WaitlistOffered

from groupbuy.demo.pacer import Pacer
from groupbuy.demo.plan import (
    LOCK_TTL_S,
    OFFER_TTL_S,
    PAY_DELAY_S,
    PAY_SHARE,
    RESTOCK_EVERY_S,
    RESTOCK_SHARE,
    TEAM_SIZE,
    UNLOCK_DELAY_S,
    UNLOCK_SHARE,
    WAIT_POLL_S,
    WAITLIST_MAX_LEN,
    WAITLIST_TTL_S,
    Plan,
)
from groupbuy.demo.tally import Tally

# The answers that send a shopper elsewhere rather than count as refusals.
NO_SEAT = "no_team_available"
SOLD_OUT = "activity_sold_out"
NOT_WAITING = "not_waiting"
EXPIRY_MARGIN_S = 1.0  # past a lock's lifetime: it has surely expired by then


class Sale:
    """Shoppers of one activity, arriving at the plan's pace until stopped."""

    def __init__(
        self,
        gb: GroupBuyClient,
        pacer: Pacer,
        plan: Plan,
        tally: Tally,
        seed: int | None,
        say: Callable[[str], None],
    ) -> None:
        self._gb = gb
        self._pacer = pacer
        self._plan = plan
        self._tally = tally
        self._seed = seed
        self._say = say
        self._shoppers = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def aid(self) -> str:
        """The activity's id."""
        return self._plan.activity_id

    async def create(self) -> None:
        """Create the activity: teams of TEAM_SIZE, short locks, the plan's stock, a line."""
        plan = self._plan
        await self._pacer.send(
            lambda: self._gb.create_activity(
                plan.activity_id,
                name="Demo flash sale",
                team_size=TEAM_SIZE,
                lock_ttl_s=LOCK_TTL_S,
                team_deadline_s=plan.team_deadline_s,
                stock=plan.stock,
                waitlist_max_len=WAITLIST_MAX_LEN,
                waitlist_ttl_s=WAITLIST_TTL_S,
                waitlist_offer_ttl_s=OFFER_TTL_S,
            )
        )

    def _random(self, stream: str) -> random.Random:
        """The choices of one stream (the arrivals, a shopper): the same for the same seed
        whatever the order the service answers in; unseeded without a seed."""
        return random.Random(None if self._seed is None else f"{self._seed}:{stream}")

    async def run(self) -> None:
        """Let shoppers arrive (spaced at random around the plan's pace) and the shop watch
        its line, until cancelled; then cancel every shopper still busy."""
        restocking = asyncio.create_task(self._restock())
        arrivals = self._random("arrivals")
        try:
            while True:
                self._shoppers += 1
                self._start(self._shopper(self._plan.user(self._shoppers)))
                await asyncio.sleep(arrivals.expovariate(self._plan.arrivals_per_s))
        finally:
            for task in [*self._tasks, restocking]:
                task.cancel()
            await asyncio.gather(*self._tasks, restocking, return_exceptions=True)

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _shopper(self, user: str) -> None:
        """One shopper: a seat in any team, else a team of their own, else the line."""
        try:
            taken = await self._pacer.send(lambda: self._gb.join(self.aid, user))
        except GroupBuyAPIError as error:
            if error.code == NO_SEAT:
                await self._open_team(user)
            elif error.code == SOLD_OUT:
                await self._wait_in_line(user)
            else:
                self._refused(error)
            return
        except GroupBuyTransportError:
            self._tally.failed += 1
            return
        self._tally.locks += 1
        await self._decide(user, taken["team_id"])

    async def _decide(self, user: str, team_id: str) -> None:
        """On the payment page: pay, unlock, or walk off and let the lock expire."""
        rng = self._random(user)
        choice = rng.random()
        if choice < PAY_SHARE:
            await asyncio.sleep(rng.uniform(*PAY_DELAY_S))
            await self._pay(user, team_id)
        elif choice < PAY_SHARE + UNLOCK_SHARE:
            await asyncio.sleep(rng.uniform(*UNLOCK_DELAY_S))
            if await self._answered(lambda: self._unlock(user, team_id)):
                self._tally.unlocked += 1
        else:
            await asyncio.sleep(LOCK_TTL_S + EXPIRY_MARGIN_S)
            self._tally.expired += 1

    async def _unlock(self, user: str, team_id: str) -> None:
        await self._pacer.send(lambda: self._gb.unlock(self.aid, team_id, user))

    async def _pay(self, user: str, team_id: str) -> None:
        order = f"{user}-order"
        try:
            confirmed = await self._pacer.send(
                lambda: self._gb.confirm(self.aid, team_id, user, order)
            )
        except GroupBuyAPIError as error:
            self._refused(error)
            return
        except GroupBuyTransportError:
            self._tally.failed += 1
            return
        self._tally.paid += 1
        self._tally.teams_formed += confirmed["formed"]

    async def _open_team(self, user: str) -> None:
        """No free seat: the shopper leads a team of their own (a member at once)."""
        try:
            await self._pacer.send(
                lambda: self._gb.open_team(self.aid, user, order_id=f"{user}-order")
            )
        except GroupBuyAPIError as error:
            if error.code == SOLD_OUT:
                await self._wait_in_line(user)
            else:
                self._refused(error)
            return
        except GroupBuyTransportError:
            self._tally.failed += 1
            return
        self._tally.teams_opened += 1

    async def _wait_in_line(self, user: str) -> None:
        """Sold out: queue for the next unit (if the demo's line has room), poll the place
        until the line offers a lock, then pay for it."""
        if self._tally.waiting >= self._plan.max_waiters:
            self._tally.walked_away += 1
            return
        self._tally.waiting += 1
        try:
            team_id = await self._lock_from_line(user)
        except GroupBuyAPIError as error:
            self._refused(error)
            return
        except GroupBuyTransportError:
            self._tally.failed += 1
            return
        finally:
            self._tally.waiting -= 1
        if team_id is None:
            self._tally.left_line += 1
            return
        self._tally.locks += 1
        await self._pay(user, team_id)

    async def _lock_from_line(self, user: str) -> str | None:
        """The team whose seat the line (or a free seat at once) gave the user; None when
        the entry ended without an offer (expired, dropped)."""
        answer = await self._pacer.send(lambda: self._gb.wait(self.aid, user))
        if answer["status"] == "locked":
            return answer["team_id"]
        if answer["status"] == "queued":
            self._tally.queued += 1
            offer = await self._poll_place(user)
            if offer is None:
                return None
            answer = offer
        self._tally.offered += 1
        return answer["team_id"]

    async def _poll_place(self, user: str) -> WaitlistOffered | None:
        """The offer the line made the user, or None when the entry ended without one."""
        while True:
            await asyncio.sleep(WAIT_POLL_S)
            try:
                entry = await self._pacer.send(lambda: self._gb.waitlist_entry(self.aid, user))
            except GroupBuyAPIError as error:
                if error.code == NOT_WAITING:
                    return None
                raise
            if entry["status"] == "offered":
                return entry

    async def _restock(self) -> None:
        """The shop: every RESTOCK_EVERY_S, a sold-out sale with a line gets more units (a
        share of the first stock, and at least one for each waiting): the raise serves the
        line at once, and the sale goes on."""
        while True:
            await asyncio.sleep(RESTOCK_EVERY_S)
            await self._answered(self._restock_once)

    async def _restock_once(self) -> None:
        activity = await self._pacer.send(lambda: self._gb.get_activity(self.aid))
        waiting = activity["waiting"]
        if waiting == 0 or activity.get("stock_left", 1) > 0:
            return
        units = max(waiting, round(self._plan.stock * RESTOCK_SHARE))
        stock = activity.get("stock", 0) + units
        await self._pacer.send(lambda: self._gb.update_activity(self.aid, stock=stock))
        self._tally.restocked += units
        self._say(f"restock: {units} more units, {waiting} waiting (stock {stock})")

    async def _answered(self, work: Callable[[], Awaitable[object]]) -> bool:
        """Run `work` (its requests paced); False (counted) when one was refused or got
        no answer."""
        try:
            await work()
        except GroupBuyAPIError as error:
            self._refused(error)
            return False
        except GroupBuyTransportError:
            self._tally.failed += 1
            return False
        return True

    def _refused(self, error: GroupBuyAPIError) -> None:
        self._tally.refused[error.code] += 1
