"""Key guessing throttled (SPEC §3): failed authentications counted per client address in
Redis, so every API process sees the same count.

After `[auth] guess_limit` failures (401s, failed console sign-ins) from one address within
`guess_window_s` of its first, the address is refused until that window ends: the HTTP
layer asks `refused_for` before it looks at a request's key, and reports each failure with
`failed`. One counter per address (lua/guess_count.lua: INCRBY and PEXPIRE in one call),
each under its own hash tag, so a Redis Cluster spreads the addresses over its shards.

A fixed window, not a sliding one: a guesser gets at most `guess_limit` tries per window,
and a success does not reset the count (a holder of one key could otherwise interleave it
with guesses of another).

When Redis does not answer (or is over maxmemory and refuses the call), the throttle lets
requests through unthrottled (open, as the rate limits are: storage/ratelimit.py) and
counts nothing; for SKIP_AFTER_FAILURE_S after a failed call no request waits for another
try. The request itself then answers what it answers without Redis (a 401 stays a 401; a
business call 503s by itself): the throttle never turns a request into a 500.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import math
import time

import redis.exceptions

from groupbuy.settings import AuthSettings
from groupbuy.storage.calls import guess_count
from groupbuy.storage.keys import Keys
from groupbuy.storage.ratelimit import UNAVAILABLE
from groupbuy.storage.reachability import unreachable
from groupbuy.storage.scripts import Scripts

log = logging.getLogger(__name__)

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# After a failed call, the throttle is skipped this long; one request then tries again.
SKIP_AFTER_FAILURE_S = 0.5


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
            answer = await guess_count(self._scripts, counter, add, self._window_ms)
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
        return answer
