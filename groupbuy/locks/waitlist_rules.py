"""An activity's waitlist rules (SPEC §3 "Waitlist"): how many wait, for how long, and how
long an offered lock lives; what a create sets and what the body shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The waitlist's defaults: entries in an activity's lines at most, how long an entry waits.
WAITLIST_MAX_LEN = 10_000
WAITLIST_TTL_S = 600


@dataclass(frozen=True)
class WaitlistRules:
    """An activity's waitlist (SPEC §3 "Waitlist"); None: the default."""

    max_len: int | None = None
    ttl_s: int | None = None
    offer_ttl_s: int | None = None

    def columns(self) -> dict[str, Any]:
        """The activity_rules columns."""
        return {
            "waitlist_max_len": self.max_len,
            "waitlist_ttl_s": self.ttl_s,
            "waitlist_offer_ttl_s": self.offer_ttl_s,
        }

    def shown(self, lock_ttl_s: int) -> dict[str, int]:
        """The activity body's `waitlist`, defaults filled in."""
        return waitlist_body(self.max_len, self.ttl_s, self.offer_ttl_s, lock_ttl_s)


def waitlist_body(
    max_len: int | None, ttl_s: int | None, offer_ttl_s: int | None, lock_ttl_s: int
) -> dict[str, int]:
    """An activity's `waitlist` as the API shows it (and the scripts read it)."""
    return {
        "max_len": max_len or WAITLIST_MAX_LEN,
        "ttl_s": ttl_s or WAITLIST_TTL_S,
        "offer_ttl_s": offer_ttl_s or lock_ttl_s,
    }
