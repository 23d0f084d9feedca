"""Rate limits decided in the process, counted in Redis behind the requests.

Each process keeps its own copy of the GCRA buckets of lua/ratelimit_take.lua: one
"theoretical arrival time" (TAT) per bucket, on the process's monotonic clock. A request
is decided from that copy at once, with no call in series; what the process let through
is counted in Redis by lua/ratelimit_debit.lua in the background: what one event-loop
turn let through leaves at the end of the turn, one call per API key. A key has one count
in flight at a time: what it lets through meanwhile leaves when that count is answered.
So Redis runs a key's counts in the order their answers arrive, and each answer, which
holds every process's counts, replaces the copy (with what the process let through since
added back).

The bound: a process lets through at most `credit` requests of a bucket that Redis has
not counted yet (a plan's credits: local_share x quota, at least 1); a request past that
waits for the call in flight instead. Counting is never refused (a request let through
is counted even past the limit, and the bucket then refuses longer), so over any span
of T seconds a bucket lets through at most quota + T x quota / window_s requests, plus
the sum of the credits of the processes sharing it: with P processes and the same
settings, P x credit. A refusal is never wrong: the copy only misses other processes'
requests, so it is at most as full as the bucket in Redis. (Counts of one key in flight
side by side could have their answers cross, and the copy would then hold the older
count twice, refusing requests with room left: hence one at a time.) The RateLimit
field's `r` and `t` are this process's estimate (exact with one process).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from groupbuy.storage.calls import ratelimit_debit
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.scripts import Scripts

SWEEP_ABOVE = 1024  # copies held before full ones are forgotten
Limit = tuple[int, int, int]
"""One bucket's (quota, window_us, credit)."""


class LocalBucket:
    """A process's copy of one bucket."""

    __slots__ = ("owed", "pending", "tat_us")

    def __init__(self) -> None:
        self.tat_us = 0.0  # on the local clock; <= now: full
        self.owed = 0  # let through, not yet counted by Redis (pending and in flight)
        self.pending = 0  # let through, not yet sent


class LocalLimiter:
    """Decides requests from the process's copy of the buckets and counts them in Redis in
    the background (see the module doc). `answered(key_id)` and `failed(key_id, error)`
    hear how each call for a key's buckets ended."""

    def __init__(
        self,
        scripts: Scripts,
        clock: RedisClock,
        answered: Callable[[str], None],
        failed: Callable[[str, Exception], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scripts = scripts
        self._clock = clock
        self._answered = answered
        self._failed = failed
        self._monotonic = monotonic
        self.buckets: dict[str, LocalBucket] = {}
        # API key id -> its buckets with requests to count: bucket key -> (quota, window_us)
        self._dirty: dict[str, dict[str, tuple[int, int]]] = {}
        # Done when the counts of what was let through this turn are answered (None: no
        # counts about to leave); the counts in flight, and the keys they are for.
        self._next: asyncio.Future[None] | None = None
        self._counting: set[asyncio.Task[None]] = set()
        self._in_flight: set[str] = set()
        self._swept_us = 0.0  # when full buckets were last forgotten

    def now_us(self) -> float:
        """Now on the local clock, moved with the scripts' clock shift (tests move both)."""
        return self._monotonic() * 1_000_000 + self._clock.shift_ms * 1000

    async def take(self, key_id: str, keys: Sequence[str], limits: Sequence[Limit]) -> list[Any]:
        """Take one request from every bucket, or from none: the reply ratelimit_take would
        give ({code, remaining, reset_s, wait_us} per bucket), decided here."""
        while True:
            reply = self.decide(key_id, keys, limits)
            if reply is not None:
                return reply
            # A bucket's credit is spent: its count frees it, one way or another (owed > 0:
            # the count is about to leave, or in flight).
            if self._next is not None:
                await asyncio.shield(self._next)
            else:
                assert self._counting
                await asyncio.wait(self._counting, return_when=asyncio.FIRST_COMPLETED)

    async def read(self, keys: Sequence[str], limits: Sequence[Limit]) -> None:
        """Copy the buckets from Redis (before deciding a key's requests here again)."""
        args = [n for quota, window, _credit in limits for n in (quota, window, 0)]
        aheads = await ratelimit_debit(self._scripts, keys, self._clock.shift_ms, args)
        now = self.now_us()
        for key, ahead, (quota, window, _credit) in zip(keys, aheads, limits, strict=True):
            bucket = self.buckets.get(key)
            if bucket is None:
                bucket = self.buckets[key] = LocalBucket()
            bucket.tat_us = now + int(ahead) + bucket.owed * window / quota

    def decide(self, key_id: str, keys: Sequence[str], limits: Sequence[Limit]) -> list[Any] | None:
        """The reply for one request, or None when it must wait for a count in flight."""
        now = self.now_us()
        limited = spent = False
        found: list[LocalBucket | None] = []
        tats: list[float] = []
        for key, (quota, window, credit) in zip(keys, limits, strict=True):
            bucket = self.buckets.get(key)
            found.append(bucket)
            tat = now if bucket is None or bucket.tat_us < now else bucket.tat_us
            tats.append(tat)
            if tat + window / quota - window - now > 0:
                limited = True
            elif bucket is not None and bucket.owed >= credit:
                spent = True
        if limited:
            return _refused(now, tats, limits)
        if spent:
            return None
        reply: list[Any] = [0]
        dirty = self._dirty.get(key_id)
        if dirty is None:
            dirty = self._dirty[key_id] = {}
        for key, bucket, tat, (quota, window, _c) in zip(keys, found, tats, limits, strict=True):
            if bucket is None:
                bucket = self.buckets[key] = LocalBucket()
            interval = window / quota
            bucket.tat_us = tat + interval
            bucket.owed += 1
            bucket.pending += 1
            dirty[key] = (quota, window)
            ahead = bucket.tat_us - now
            reply += (math.floor((window - ahead) / interval + 1e-9), math.ceil(ahead / 1e6), 0)
        self._send_soon()
        return reply

    async def aclose(self) -> None:
        """Count what is left to count (the service is stopping)."""
        while self._next is not None or self._counting:
            if self._next is not None:
                await asyncio.shield(self._next)
            else:
                await asyncio.wait(self._counting)

    def _send_soon(self) -> None:
        """The counts leave once this turn's requests are decided."""
        if self._next is None:
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            loop.call_soon(self._send)

    def _send(self) -> None:
        done, self._next = self._next, None
        assert done is not None
        # A key with a count in flight keeps its counts until that one is answered.
        batch = {
            key_id: self._dirty.pop(key_id)
            for key_id in list(self._dirty)
            if key_id not in self._in_flight
        }
        if not batch:
            done.set_result(None)
            return
        self._in_flight.update(batch)
        task = asyncio.get_running_loop().create_task(self._count_all(batch, done))
        self._counting.add(task)
        task.add_done_callback(self._counting.discard)

    async def _count_all(
        self, batch: dict[str, dict[str, tuple[int, int]]], done: asyncio.Future[None]
    ) -> None:
        try:
            if len(batch) == 1:
                await self._count(*next(iter(batch.items())))
            else:
                await asyncio.gather(*(self._count(k, b) for k, b in batch.items()))
        finally:
            done.set_result(None)
        self._sweep()

    async def _count(self, key_id: str, entries: dict[str, tuple[int, int]]) -> None:
        try:
            await self._count_once(key_id, entries)
        finally:
            self._in_flight.discard(key_id)
            if key_id in self._dirty:
                self._send_soon()  # what the key let through while this count was out

    async def _count_once(self, key_id: str, entries: dict[str, tuple[int, int]]) -> None:
        keys = list(entries)
        buckets = [self.buckets[key] for key in keys]
        counts = [bucket.pending for bucket in buckets]
        args: list[int] = []
        for bucket, (quota, window) in zip(buckets, entries.values(), strict=True):
            args += (quota, window, bucket.pending)
            bucket.pending = 0
        try:
            aheads = await ratelimit_debit(self._scripts, keys, self._clock.shift_ms, args)
        except BaseException as error:
            # Those requests went through uncounted, as when the limiter cannot ask Redis.
            for bucket, count in zip(buckets, counts, strict=True):
                bucket.owed -= count
            if not isinstance(error, Exception):
                raise
            self._failed(key_id, error)
            return
        now = self.now_us()
        for bucket, count, ahead, (quota, window) in zip(
            buckets, counts, aheads, entries.values(), strict=True
        ):
            bucket.owed -= count
            # Redis's bucket, with what this process let through that it has not counted
            # (not sent yet: the key's next count).
            bucket.tat_us = now + int(ahead) + bucket.owed * window / quota
        self._answered(key_id)

    def _sweep(self) -> None:
        """Forget full buckets with nothing owed (a missing copy means a full bucket), at
        most once a second and only past SWEEP_ABOVE copies: a flash sale's users each
        leave one for a window."""
        now = self.now_us()
        if len(self.buckets) <= SWEEP_ABOVE or now - self._swept_us < 1_000_000:
            return
        self._swept_us = now
        self.buckets = {
            key: bucket
            for key, bucket in self.buckets.items()
            if bucket.owed > 0 or bucket.tat_us > now
        }


def _refused(now: float, tats: list[float], limits: Sequence[Limit]) -> list[Any]:
    """ratelimit_take's reply for a request refused by at least one bucket: taken from
    none, each bucket as it stands."""
    reply: list[Any] = [1]
    for tat, (quota, window, _credit) in zip(tats, limits, strict=True):
        interval = window / quota
        wait = tat + interval - window - now
        if wait > 0:
            reply += (0, math.ceil((tat - now) / 1e6), math.ceil(wait))
        else:
            reply += (math.floor((window - (tat - now)) / interval + 1e-9),
                      math.ceil((tat - now) / 1e6), 0)  # fmt: skip
    return reply
