"""The demo's request rate: every request waits for its turn, at most `rate` a second."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Pacer:
    """Hands out turns at least 1/rate seconds apart, in the order they were asked for:
    however many shoppers run at once, the service gets at most `rate` requests a second."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("the rate must be above 0")
        self._gap_s = 1.0 / rate
        self._clock = clock
        self._next_at = 0.0
        self.requests = 0

    async def turn(self) -> None:
        """Wait until this caller may send one request."""
        now = self._clock()
        at = max(now, self._next_at)
        self._next_at = at + self._gap_s  # reserved before sleeping: one loop, no race
        if at > now:
            await asyncio.sleep(at - now)
        self.requests += 1  # counted once due: a caller cancelled meanwhile sent nothing

    async def send(self, request: Callable[[], Awaitable[T]]) -> T:
        """Send `request()` on its turn; its answer."""
        await self.turn()
        return await request()
