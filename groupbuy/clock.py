"""Time as the scripts see it: Redis's own clock, plus a shift that only tests move."""

from __future__ import annotations


class RedisClock:
    """Scripts read Redis's TIME and add `shift_ms`; production never changes the shift."""

    def __init__(self) -> None:
        self.shift_ms = 0

    def advance(self, seconds: float) -> None:
        """Move the scripts' notion of now forward (tests of expiry, without sleeping)."""
        self.shift_ms += round(seconds * 1000)
