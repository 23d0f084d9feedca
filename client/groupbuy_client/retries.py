"""When the clients send a request again, and how long they wait first.

Every call of the API is idempotent: a repeated lock answers the lock it took, a repeated
grab `already_grabbed` with the same amount. So a request whose answer was lost can be
sent again, and so can one the service turned away for now:
- 429 with `Retry-After` (a rate limit, or too many failed authentications);
- 503 (Redis, SQL or a Cluster node unavailable; the call may have applied);
- no answer at all (a refused or broken connection, a timeout).

Waits grow exponentially with full jitter, so callers that failed together do not come
back together. A `Retry-After` longer than the backoff replaces it, up to a cap: past the
cap the answer is raised rather than waited for.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

# The statuses sent again: 429 only with a Retry-After (without one, the caller's own
# limit is the likelier cause, and waiting blindly would not help).
_RATE_LIMITED = 429
_UNAVAILABLE = 503


@dataclass(frozen=True, slots=True)
class Retries:
    """How a client retries: `attempts` tries in all (the first included), waits of
    `base_s` doubling up to `max_backoff_s` (each a random fraction of that: full jitter),
    and a server's `Retry-After` honoured up to `max_retry_after_s`."""

    attempts: int = 4
    base_s: float = 0.1
    max_backoff_s: float = 2.0
    max_retry_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts counts the first try: at least 1")
        if min(self.base_s, self.max_backoff_s, self.max_retry_after_s) < 0:
            raise ValueError("waits cannot be negative")

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """The jittered wait after failed try number `attempt` (1 for the first try)."""
        ceiling = min(self.max_backoff_s, self.base_s * 2 ** (attempt - 1))
        return rng.uniform(0, ceiling)

    def wait_after_answer(
        self, attempt: int, status: int, headers: Mapping[str, str], rng: random.Random
    ) -> float | None:
        """Seconds to wait before sending again after an answer, or None: do not retry."""
        if attempt >= self.attempts or status not in (_RATE_LIMITED, _UNAVAILABLE):
            return None
        retry_after = retry_after_s(headers.get("retry-after"))
        if status == _RATE_LIMITED and retry_after is None:
            return None
        wait = self.backoff_s(attempt, rng)
        if retry_after is not None:
            if retry_after > self.max_retry_after_s:
                return None
            wait = max(wait, retry_after)
        return wait

    def wait_after_no_answer(self, attempt: int, rng: random.Random) -> float | None:
        """Seconds to wait before sending again after a lost connection, or None."""
        if attempt >= self.attempts:
            return None
        return self.backoff_s(attempt, rng)


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """A `Retry-After` header in seconds: delta-seconds or an HTTP date; None when absent
    or unreadable."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - (now or datetime.now(UTC))).total_seconds())


# What a client does unless told otherwise: 4 tries, waits of up to 0.1, 0.2 and 0.4 s (or
# the server's Retry-After, up to 30 s). `retries=None` turns retrying off.
DEFAULT_RETRIES = Retries()
