"""When a failed attempt is tried again: the retry schedule, its jitter and `Retry-After`."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from datetime import UTC
from email.utils import parsedate_to_datetime

# Waits after the 1st, 2nd, ... failed attempt (SPEC §3): 5 s, 5 min, 30 min, 2 h, 5 h,
# 10 h, 10 h. After the last one fails, the delivery is `failed`.
RETRY_WAITS_S: tuple[int, ...] = (5, 300, 1800, 7200, 18000, 36000, 36000)
JITTER = 0.2
# Statuses whose Retry-After the schedule follows.
RETRY_AFTER_STATUSES = (429, 503)

# delay-seconds = 1*DIGIT, ASCII only (str.isdigit() also takes "²" and other scripts'
# digits, which int() refuses). More digits than this are not a delay a receiver means.
MAX_DELAY_DIGITS = 10
_DELAY_SECONDS = re.compile(rf"[0-9]{{1,{MAX_DELAY_DIGITS}}}", re.ASCII)
# HTTP-date's three forms (IMF-fixdate, RFC 850, asctime) use letters, digits, spaces,
# commas, colons and dashes, in under 40 characters: anything else is not parsed at all.
_HTTP_DATE = re.compile(r"[A-Za-z0-9 ,:\-]{1,40}", re.ASCII)


def retry_wait_ms(
    tries: int,
    retry_after_s: float | None = None,
    uniform: Callable[[float, float], float] = random.uniform,
) -> int | None:
    """Milliseconds to wait after the `tries`-th failed attempt of a delivery, or None when
    the schedule is over (the delivery has failed).

    The step's wait varies by ±20 % (so that endpoints that failed together are not retried
    together); a longer `retry_after_s` replaces it, but never past the next step's wait.
    """
    if tries < 1 or tries > len(RETRY_WAITS_S):
        return None
    step = RETRY_WAITS_S[tries - 1]
    wait = step * uniform(1 - JITTER, 1 + JITTER)
    if retry_after_s is not None and retry_after_s > wait:
        ceiling = RETRY_WAITS_S[min(tries, len(RETRY_WAITS_S) - 1)]
        wait = min(retry_after_s, ceiling)
    return round(wait * 1000)


def parse_retry_after(value: str | None, now_ms: int) -> float | None:
    """A `Retry-After` header's delay in seconds, or None when absent or not what RFC 9110
    allows: delay-seconds (ASCII digits, at most MAX_DELAY_DIGITS of them) or an HTTP-date.

    The header comes from the receiver, so anything may arrive: this never raises, and what
    it returns is finite and at least 0 (the schedule caps it at the next step's wait).
    """
    if not value:
        return None
    value = value.strip()
    if _DELAY_SECONDS.fullmatch(value):
        return float(int(value))
    if not _HTTP_DATE.fullmatch(value):
        return None
    try:
        moment = parsedate_to_datetime(value)
        if moment.tzinfo is None:  # asctime's form carries no zone: HTTP dates are GMT
            moment = moment.replace(tzinfo=UTC)
        return max(0.0, moment.timestamp() - now_ms / 1000)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
