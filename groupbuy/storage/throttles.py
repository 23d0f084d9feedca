"""Request throttles decided in Redis, shared exactly by every API process: the rate
limits (token buckets per API key and per user) and the key-guessing throttle (failed
authentications per client address). Both are open, not shut: when Redis does not
answer, requests go through unthrottled, and for SKIP_AFTER_FAILURE_S after a failed
call no request waits for another try.

Rate limits: one script call takes a request from the API key's bucket and the user's
bucket of a route class together, or from neither. The buckets are GCRA token buckets
(lua/ratelimit_take.lua): `quota` requests at once at most, refilled at
`quota / window_s` per second, one key each holding a time, on Redis's clock. The call
goes through the scripts registry and so through the auto-pipeline: under load it rides
in the same round trips as the grabs and locks of other requests. On a Redis Cluster a
key's buckets share one slot: while its primary is down (until its replica is promoted)
the key's requests to the other shards go on at their rate instead of each waiting for
the call to fail first.

Key guessing (SPEC §3): after `[auth] guess_limit` failures (401s, failed console
sign-ins) from one address within `guess_window_s` of its first, the address is refused
until that window ends: the HTTP layer asks `refused_for` before it looks at a request's
key, and reports each failure with `failed`. One counter per address
(lua/guess_count.lua: INCRBY and PEXPIRE in one call), each under its own hash tag, so a
Redis Cluster spreads the addresses over its shards. A fixed window, not a sliding one: a
guesser gets at most `guess_limit` tries per window, and a success does not reset the
count (a holder of one key could otherwise interleave it with guesses of another). When
Redis does not answer, the request itself answers what it answers without Redis (a 401
stays a 401; a business call 503s by itself): the throttle never turns a request into a
500.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import redis.exceptions

from groupbuy.settings import RATE_CLASSES, AuthSettings, RateLimitSettings
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.keys import Keys
from groupbuy.storage.reachability import UNREACHABLE, unreachable
from groupbuy.storage.specs import Field, Fixed, Scripts, ScriptSpec, Slot, shape, slots

log = logging.getLogger(__name__)
# What lets a request through unthrottled: Redis unreachable or stalled, or over maxmemory.
UNAVAILABLE = (*UNREACHABLE, redis.exceptions.OutOfMemoryError)

# After a failed call, the throttle is skipped this long; one request then tries again.
# Short beside a failover (seconds), long beside a failed call (up to its retries' time).
SKIP_AFTER_FAILURE_S = 0.5

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class RateCode(IntEnum):
    """What lua/ratelimit_take.lua answers first."""

    TAKEN = 0
    LIMITED = 1


def _as_sent(values: Any) -> Any:
    """A field read as the script sent it."""
    return values


# Per bucket, in KEYS order: remaining, reset_s, wait_us; flat, as sent (the hot path
# formats two of them into the RateLimit header as they are).
_STATES = Field("states", _as_sent, rest=True)
RATELIMIT_TAKE: ScriptSpec[RateCode] = ScriptSpec(
    "ratelimit_take",
    "Take one request from every bucket given, or from none of them (GCRA).",
    keys=(),
    args=slots(("shift_ms", "clock shift in ms (0 in production)")),
    more_keys=Slot("buckets", "the API key's bucket, then the user's; one hash tag"),
    more_args=Slot("limits", "per bucket: quota, window_us"),
    replies={
        RateCode.TAKEN: shape(
            "taken from every bucket; per bucket: remaining, reset_s, wait_us", _STATES
        ),
        RateCode.LIMITED: shape("limited: taken from none; states as TAKEN", _STATES),
    },
)
GUESS_COUNT: ScriptSpec[Fixed] = ScriptSpec(
    "guess_count",
    "Count failed authentications of one client address in a fixed window, or read them.",
    keys=slots(("counter", "the address's counter (expires when its window ends)")),
    args=slots(
        ("add", "failures to count (1), or 0 to read"),
        ("window_ms", "the window, started by the address's first failure"),
    ),
    reply=shape(
        "failures in the window, ms until it ends (0: no window)",
        ("failures", int),
        ("ms_left", int),
    ),
)

CONTRACTS: tuple[ScriptSpec[Any], ...] = (RATELIMIT_TAKE, GUESS_COUNT)

SUBJECTS = ("key", "user")


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
            reply = await RATELIMIT_TAKE.run(
                self._scripts,
                RATELIMIT_TAKE.key_list(more=keys),
                {"shift_ms": self._clock.shift_ms},
                plan.args,
            )
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


def address_subject(address: str) -> tuple[str, IpAddress | None]:
    """What a client address is counted under, and the address as an IP (None when the
    peer is no IP address, e.g. a Unix socket or a test client's name). IPv4 mapped into
    IPv6 counts as the IPv4 address; a name is counted under a digest (a key holds no
    text the client chose)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "n-" + hashlib.sha256(address.encode("utf-8", "replace")).hexdigest()[:16], None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), ip


class GuessThrottle:
    """Counts failed authentications per client address and says when one is refused."""

    def __init__(self, settings: AuthSettings, scripts: Scripts, keys: Keys) -> None:
        self._scripts = scripts
        self._keys = keys
        self.limit = settings.guess_limit
        self._window_ms = settings.guess_window_s * 1000
        self._exempt = settings.exempt_networks
        self._skip_until = 0.0
        self._reachable = True  # to log once when Redis stops answering, once when back

    @property
    def enabled(self) -> bool:
        """False with `guess_limit = 0`: nothing is counted, nobody refused."""
        return self.limit > 0

    def _counter(self, address: str) -> str | None:
        """The address's counter, or None when the address is never throttled."""
        if not self.enabled:
            return None
        subject, ip = address_subject(address)
        if ip is not None and any(ip in network for network in self._exempt):
            return None
        return self._keys.guesses(subject)

    async def refused_for(self, address: str) -> int | None:
        """Whole seconds until `address` may authenticate again (>= 1), or None when it may
        now (under the limit, exempt, throttle off, or Redis not answering)."""
        counter = self._counter(address)
        if counter is None:
            return None
        answer = await self._call(counter, 0)
        if answer is None:
            return None
        failures, left_ms = answer
        if failures < self.limit or left_ms <= 0:
            return None
        return max(1, math.ceil(left_ms / 1000))

    async def failed(self, address: str) -> None:
        """Count one failed authentication of `address`."""
        counter = self._counter(address)
        if counter is not None:
            await self._call(counter, 1)

    async def _call(self, counter: str, add: int) -> tuple[int, int] | None:
        if self._skip_until:
            now = time.monotonic()
            if now < self._skip_until:
                return None
            self._skip_until = now + SKIP_AFTER_FAILURE_S  # this call tries; others skip
        try:
            reply = await GUESS_COUNT.run(
                self._scripts,
                GUESS_COUNT.key_list(counter=counter),
                {"add": add, "window_ms": self._window_ms},
            )
        except redis.exceptions.RedisError as error:
            if not (isinstance(error, UNAVAILABLE) or unreachable(error)):
                raise
            self._skip_until = time.monotonic() + SKIP_AFTER_FAILURE_S
            if self._reachable:
                log.info("failed authentications not counted while Redis refuses: %s", error)
            self._reachable = False
            return None
        self._skip_until = 0.0
        if not self._reachable:
            log.info("failed authentications counted again")
            self._reachable = True
        return reply.failures, reply.ms_left
