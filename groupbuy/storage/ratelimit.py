"""Rate limits decided in Redis: one script call takes a request from the API key's bucket
and the user's bucket of a route class together, or from neither.

The buckets are GCRA token buckets (lua/ratelimit_take.lua): `quota` requests at once at
most, refilled at `quota / window_s` per second, one key each holding a time, on Redis's
clock, so every API process shares them exactly. The call goes through the scripts
registry and so through the auto-pipeline: under load it rides in the same round trips
as the grabs and locks of other requests.

When Redis does not answer for a key's buckets, the request goes through unlimited (open,
not shut), and so do that key's next requests for SKIP_AFTER_FAILURE_S, without a call;
then one request tries again. On a Redis Cluster a key's buckets share one slot: while
its primary is down (until its replica is promoted) the key's requests to the other
shards go on at their rate instead of each waiting for the call to fail first.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import redis.exceptions

from groupbuy.settings import RATE_CLASSES, RateLimitSettings
from groupbuy.storage.calls import RateCode, ratelimit_take
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import Keys
from groupbuy.storage.reachability import UNREACHABLE
from groupbuy.storage.scripts import Scripts

log = logging.getLogger(__name__)
# What lets a request through unlimited: Redis unreachable or stalled, or over maxmemory.
UNAVAILABLE = (*UNREACHABLE, redis.exceptions.OutOfMemoryError)

SUBJECTS = ("key", "user")
# After a failed call, a key's requests skip its buckets this long; one then tries again.
# Short beside a failover (seconds), long beside a failed call (up to its retries' time).
SKIP_AFTER_FAILURE_S = 0.5


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity, cheap as a cache key
class RatePlan:
    """The limits one request of a route class takes from, in the script's KEYS order."""

    route_class: str
    names: tuple[str, ...]  # "<class>-<subject>", e.g. "grab-user": the policies' names
    quotas: tuple[int, ...]
    windows_s: tuple[int, ...]
    by_key: bool  # the API key's bucket comes first
    by_user: bool
    args: tuple[int, ...]  # ARGV after the clock's shift: quota, window_us per bucket


@dataclass(frozen=True, slots=True)
class Bucket:
    """One limit that applied to a request, and where it stands after it."""

    name: str
    quota: int
    window_s: int
    remaining: int  # requests that could follow at once
    reset_s: int  # whole seconds until the bucket is full again
    wait_s: float  # until it would take one more request (0: it would now)


class RateDecision:
    """Whether a request may go ahead, with the state the script answered for every bucket
    it was checked against (read into Buckets only when asked: the hot path formats the
    states)."""

    __slots__ = ("allowed", "plan", "states")

    def __init__(self, allowed: bool, plan: RatePlan, states: list[Any]) -> None:
        self.allowed = allowed
        self.plan = plan
        self.states = states  # ratelimit_take's `states`: remaining, reset_s, wait_us each

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        """Every bucket the request was checked against, in the plan's order."""
        plan, r = self.plan, self.states
        return tuple(
            Bucket(name, plan.quotas[i], plan.windows_s[i], int(r[3 * i]),
                   int(r[1 + 3 * i]), int(r[2 + 3 * i]) / 1_000_000)
            for i, name in enumerate(plan.names)
        )  # fmt: skip

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
        # Keys whose buckets did not answer: until when their requests skip the call.
        self._skip_until: dict[str, float] = {}
        # What a request of each class takes from, without and with a user; None: nothing
        # (every quota that applies is 0, no limit).
        self._plans: dict[tuple[str, bool], RatePlan | None] = {}
        for route_class in RATE_CLASSES:
            for with_user in (False, True):
                self._plans[route_class, with_user] = _plan(settings, route_class, with_user)

    async def take(self, route_class: str, key_id: str, user_id: str | None) -> RateDecision | None:
        """Take one request of `route_class` from the key's bucket and the user's (when the
        route names a user), in one script call; None when no limit applies."""
        if not self.enabled:
            return None
        try:
            plan = self._plans[route_class, user_id is not None]
        except KeyError:
            raise ValueError(f"unknown route class {route_class!r}") from None
        if plan is None:
            return None
        skip_until = self._skip_until.get(key_id)
        if skip_until is not None:
            now = time.monotonic()
            if now < skip_until:
                return None
            # This request tries; the key's others go on skipping until it has an answer.
            self._skip_until[key_id] = now + SKIP_AFTER_FAILURE_S
        keys = self._keys.rate_buckets(
            key_id, route_class, user_id if plan.by_user else None, by_key=plan.by_key
        )
        try:
            reply = await ratelimit_take(self._scripts, keys, self._clock.shift_ms, plan.args)
        except UNAVAILABLE as error:
            # Open, not shut: the operation answers 503 itself when it needs Redis (or is
            # refused over maxmemory by its own script), and what does not need it (the
            # events feed, from SQL; reads over maxmemory; the other shards of a cluster)
            # keeps serving. Redis's state is logged once by storage/reachability.py; this
            # says what it means for limits.
            self._failed(key_id, error)
            return None
        self._answered(key_id)
        # `fields[...]`, not `reply.states`: the attribute falls back to __getattr__ after a
        # failed lookup, and this runs on every limited request.
        return RateDecision(reply.code is RateCode.TAKEN, plan, reply.fields["states"])

    def _answered(self, key_id: str) -> None:
        self._skip_until.pop(key_id, None)
        if not self._reachable:
            log.info("rate limits applied again")
            self._reachable = True

    def _failed(self, key_id: str, error: Exception) -> None:
        """A call for the key's buckets failed: its requests skip them for a while."""
        self._skip_until[key_id] = time.monotonic() + SKIP_AFTER_FAILURE_S
        if self._reachable:
            log.info("rate limits not applied while Redis refuses them: %s", error)
        self._reachable = False


def _plan(settings: RateLimitSettings, route_class: str, with_user: bool) -> RatePlan | None:
    subjects = [
        subject
        for subject in SUBJECTS
        if (subject == "key" or with_user) and settings.limit(route_class, subject)[0]
    ]
    if not subjects:
        return None
    limits = [settings.limit(route_class, subject) for subject in subjects]
    return RatePlan(
        route_class,
        tuple(f"{route_class}-{subject}" for subject in subjects),
        tuple(quota for quota, _window_s in limits),
        tuple(window_s for _quota, window_s in limits),
        "key" in subjects,
        "user" in subjects,
        tuple(n for quota, window_s in limits for n in (quota, window_s * 1_000_000)),
    )
