"""The red-packet storm: a sender is funded and sends one packet, then more users than it
has shares grab it at once (the last ones find it sold out)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from groupbuy_client import GroupBuyAPIError, GroupBuyClient, GroupBuyTransportError

from groupbuy.demo.pacer import Pacer
from groupbuy.demo.plan import STORM_CENTS_PER_SHARE, STORM_EXTRA_GRABBERS, Plan
from groupbuy.demo.tally import Tally

SOLD_OUT = "sold_out"
# Grabbers start in waves this large: enough at once for a storm, few enough that each
# waits its turn at the pacer rather than all at once.
WAVE = 20


class Storm:
    """One packet of the plan's shares, and its grabbers."""

    def __init__(
        self,
        gb: GroupBuyClient,
        pacer: Pacer,
        plan: Plan,
        tally: Tally,
        say: Callable[[str], None],
    ) -> None:
        self._gb = gb
        self._pacer = pacer
        self._plan = plan
        self._tally = tally
        self._say = say

    async def run(self) -> None:
        """Fund the sender, send the packet, let the grabbers at it."""
        plan = self._plan
        amount = plan.storm_shares * STORM_CENTS_PER_SHARE
        grabbers = math.ceil(plan.storm_shares * (1 + STORM_EXTRA_GRABBERS))
        try:
            await self._pacer.send(
                lambda: self._gb.deposit(plan.sender_id, amount, f"{plan.run_id}-topup")
            )
            await self._pacer.send(
                lambda: self._gb.send_packet(
                    plan.sender_id,
                    amount,
                    plan.storm_shares,
                    packet_id=plan.packet_id,
                    message="Demo red packet storm",
                    sender_may_grab=False,
                )
            )
        except GroupBuyAPIError as error:
            self._tally.refused[error.code] += 1
            self._say(f"storm: the packet was not sent ({error})")
            return
        except GroupBuyTransportError:
            self._tally.failed += 1
            return
        self._tally.packet_shares = plan.storm_shares
        self._say(
            f"storm: packet {plan.packet_id} of {plan.storm_shares} shares "
            f"({amount / 100:.2f}), {grabbers} grabbers at once"
        )
        for wave in range(0, grabbers, WAVE):
            users = [plan.grabber(n) for n in range(wave, min(wave + WAVE, grabbers))]
            await asyncio.gather(*(self._grab(user) for user in users))

    async def _grab(self, user: str) -> None:
        try:
            grabbed = await self._pacer.send(lambda: self._gb.grab(self._plan.packet_id, user))
        except GroupBuyAPIError as error:
            if error.code == SOLD_OUT:
                self._tally.grabs_sold_out += 1
            else:
                self._tally.refused[error.code] += 1
            return
        except GroupBuyTransportError:
            self._tally.failed += 1
            return
        if grabbed["status"] == "grabbed":
            self._tally.grabbed += 1
