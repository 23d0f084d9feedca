"""Time as the scripts see it: Redis's own clock, plus a shift that only tests move."""

from __future__ import annotations

from typing import Any


class RedisClock:
    """Scripts read Redis's TIME and add `shift_ms`; production never changes the shift."""

    def __init__(self) -> None:
        self.shift_ms = 0

    async def now_ms(self, redis: Any) -> int:
        """Now as the scripts see it, read from Redis (for values computed outside a script)."""
        seconds, micros = await redis.time()
        return int(seconds) * 1000 + int(micros) // 1000 + self.shift_ms

    def advance(self, seconds: float) -> None:
        """Move the scripts' notion of now forward (tests of expiry, without sleeping)."""
        self.shift_ms += round(seconds * 1000)
