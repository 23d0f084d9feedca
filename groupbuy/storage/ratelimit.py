"""Rate limits decided in Redis: one script call takes a request from the API key's bucket
and the user's bucket of a route class together, or from neither.

The buckets are GCRA token buckets (lua/ratelimit_take.lua): `quota` requests at once at
most, refilled at `quota / window_s` per second, one key each holding a time, on Redis's
clock, so every API process shares them exactly. The call goes through the scripts
registry and so through the auto-pipeline: under load it rides in the same round trips
as the grabs and locks of other requests.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from groupbuy.settings import RATE_CLASSES, RateLimitSettings
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import Keys
from groupbuy.storage.pipelining import RETRIED
from groupbuy.storage.scripts import Scripts

log = logging.getLogger(__name__)

SCRIPT = "ratelimit_take"
SUBJECTS = ("key", "user")


class RateCode(IntEnum):
    """What lua/ratelimit_take.lua answers first."""

    TAKEN = 0
    LIMITED = 1


@dataclass(frozen=True, slots=True)
class Bucket:
    """One limit that applied to a request, and where it stands after it."""

    name: str  # "<class>-<subject>", e.g. "grab-user": the policy's name in the headers
    quota: int
    window_s: int
    remaining: int  # requests that could follow at once
    reset_s: int  # whole seconds until the bucket is full again
    wait_s: float  # until it would take one more request (0: it would now)


@dataclass(frozen=True, slots=True)
class RateDecision:
    """Whether a request may go ahead, and every bucket it was checked against."""

    allowed: bool
    buckets: tuple[Bucket, ...]

    @property
    def retry_after_s(self) -> int:
        """Whole seconds until every bucket that refused would take the request (>= 1)."""
        longest = max((b.wait_s for b in self.buckets), default=0.0)
        return max(1, math.ceil(longest))

    @property
    def limiting(self) -> tuple[Bucket, ...]:
        """The buckets that refused the request."""
        return tuple(b for b in self.buckets if b.wait_s > 0)


class RateLimitService:
    """Takes requests from the token buckets of `[ratelimit]` (see the module doc)."""

    def __init__(
        self, settings: RateLimitSettings, scripts: Scripts, keys: Keys, clock: RedisClock
    ) -> None:
        self._scripts = scripts
        self._keys = keys
        self._clock = clock
        self.enabled = settings.enabled
        self._reachable = True  # to log once when Redis stops answering, once when it is back
        # (name, quota, window_us) per class and subject; a quota of 0 is no limit.
        self._limits: dict[tuple[str, str], tuple[str, int, int]] = {}
        for route_class in RATE_CLASSES:
            for subject in SUBJECTS:
                quota, window_s = settings.limit(route_class, subject)
                if quota:
                    name = f"{route_class}-{subject}"
                    self._limits[route_class, subject] = (name, quota, window_s * 1_000_000)

    async def take(self, route_class: str, key_id: str, user_id: str | None) -> RateDecision | None:
        """Take one request of `route_class` from the key's bucket and the user's (when the
        route names a user), in one script call; None when no limit applies."""
        if not self.enabled:
            return None
        if route_class not in RATE_CLASSES:
            raise ValueError(f"unknown route class {route_class!r}")
        key_limit = self._limits.get((route_class, "key"))
        user_limit = self._limits.get((route_class, "user")) if user_id is not None else None
        limits = [limit for limit in (key_limit, user_limit) if limit is not None]
        if not limits:
            return None
        every_key = self._keys.rate_buckets(key_id, route_class, user_id)
        keys = [k for k, limit in zip(every_key, (key_limit, user_limit), strict=False) if limit]
        args: list[Any] = [self._clock.shift_ms]
        for _name, quota, window_us in limits:
            args += [quota, window_us]
        try:
            reply = await self._scripts.call(SCRIPT, keys, args)
        except RETRIED as error:
            # Open, not shut: the operation answers 503 itself when it needs Redis, and a
            # route that does not (the events feed, from SQL) keeps serving.
            if self._reachable:
                log.warning("rate limits not applied while Redis does not answer: %s", error)
            self._reachable = False
            return None
        if not self._reachable:
            log.warning("rate limits applied again: Redis answers")
            self._reachable = True
        code = RateCode(int(reply[0]))  # ValueError on an unknown code: a bug
        buckets = tuple(
            Bucket(
                name,
                quota,
                window_us // 1_000_000,
                int(reply[1 + 3 * i]),
                int(reply[2 + 3 * i]),
                int(reply[3 + 3 * i]) / 1_000_000,
            )
            for i, (name, quota, window_us) in enumerate(limits)
        )
        return RateDecision(code is RateCode.TAKEN, buckets)
