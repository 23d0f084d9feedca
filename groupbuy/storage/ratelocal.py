"""Rate limits decided in the process, counted in Redis behind the requests.

Each process keeps its own copy of the GCRA buckets of lua/ratelimit_take.lua: one
"theoretical arrival time" (TAT) per bucket, on the process's monotonic clock. A request
is decided from that copy at once, with no call in series; what the process let through
is counted in Redis by lua/ratelimit_debit.lua in the background: what one event-loop
turn let through leaves at the end of the turn, one call per API key. A key has one count
in flight at a time: what it lets through meanwhile leaves when that count is answered.
A read of a key's buckets (its first request after a start or a failure) waits for such a
count too. So Redis runs a key's calls in the order their answers arrive, and each answer,
which holds every process's counts, replaces the copy (with what the process let through
since added back). A count that fails or is cancelled gives its requests back: they went
through uncounted, as when Redis is away.

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
import functools
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass(slots=True)
class _Count:
    """One call's worth for one API key: its buckets and what each let through uncounted,
    taken from `pending` when the call is sent (settled: `owed` given back)."""

    key_id: str
    keys: list[str]
    buckets: list[LocalBucket]
    limits: list[tuple[int, int]]  # quota, window_us
    counts: list[int]
    settled: bool = False

    def settle(self) -> None:
        """Redis answered for these requests, or will not: they are owed no more."""
        if not self.settled:
            self.settled = True
            for bucket, count in zip(self.buckets, self.counts, strict=True):
                bucket.owed -= count


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
        self._reading: Counter[str] = Counter()  # key id -> its reads in flight
        # Done when a count or a read ends (None: nobody waits for one).
        self._progress: asyncio.Future[None] | None = None
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
            # the count is about to leave, waits for a call of its key, or is in flight).
            await self._next_change()

    async def read(self, key_id: str, keys: Sequence[str], limits: Sequence[Limit]) -> None:
        """Copy a key's buckets from Redis (before deciding its requests here again). Not
        beside a count of the key: their answers could cross."""
        while key_id in self._in_flight:
            await self._next_change()
        args = [n for quota, window, _credit in limits for n in (quota, window, 0)]
        self._reading[key_id] += 1
        try:
            aheads = await ratelimit_debit(self._scripts, keys, self._clock.shift_ms, args)
        finally:
            self._reading[key_id] -= 1
            if not self._reading[key_id]:
                del self._reading[key_id]
            self._ended(key_id)
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
        while self._next is not None or self._counting or self._reading:
            await self._next_change()

    async def _next_change(self) -> None:
        """Until the counts about to leave are answered, or else until a call ends."""
        if self._next is not None:
            await asyncio.shield(self._next)
            return
        if self._progress is None:
            self._progress = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._progress)

    def _ended(self, key_id: str) -> None:
        """A count or a read of the key ended: what it held back may leave, and whoever
        waits for a change looks again."""
        if key_id in self._dirty:
            self._send_soon()
        progress, self._progress = self._progress, None
        if progress is not None:
            progress.set_result(None)

    def _send_soon(self) -> None:
        """The counts leave once this turn's requests are decided."""
        if self._next is None:
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            loop.call_soon(self._send)

    def _send(self) -> None:
        done, self._next = self._next, None
        assert done is not None
        # A key with a call in flight keeps its counts until that one ends.
        counts = [
            self._take_pending(key_id, self._dirty.pop(key_id))
            for key_id in list(self._dirty)
            if key_id not in self._in_flight and key_id not in self._reading
        ]
        if not counts:
            done.set_result(None)
            return
        self._in_flight.update(count.key_id for count in counts)
        task = asyncio.get_running_loop().create_task(self._count_all(counts))
        self._counting.add(task)
        task.add_done_callback(functools.partial(self._counted, counts, done))

    def _take_pending(self, key_id: str, entries: dict[str, tuple[int, int]]) -> _Count:
        buckets = [self.buckets[key] for key in entries]
        counts = [bucket.pending for bucket in buckets]
        for bucket in buckets:
            bucket.pending = 0
        return _Count(key_id, list(entries), buckets, list(entries.values()), counts)

    def _counted(self, counts: list[_Count], done: asyncio.Future[None], task: Any) -> None:
        """Whatever became of the task (answered, failed, cancelled before it began): the
        keys are free again, and requests Redis did not count are owed no more."""
        self._counting.discard(task)
        done.set_result(None)
        for count in counts:
            count.settle()
            self._in_flight.discard(count.key_id)
            self._ended(count.key_id)

    async def _count_all(self, counts: list[_Count]) -> None:
        if len(counts) == 1:
            await self._count(counts[0])
        else:
            await asyncio.gather(*(self._count(count) for count in counts))
        self._sweep()

    async def _count(self, count: _Count) -> None:
        args: list[int] = []
        for (quota, window), n in zip(count.limits, count.counts, strict=True):
            args += (quota, window, n)
        try:
            aheads = await ratelimit_debit(self._scripts, count.keys, self._clock.shift_ms, args)
            now = self.now_us()
            count.settle()
            for bucket, ahead, (quota, window) in zip(
                count.buckets, aheads, count.limits, strict=True
            ):
                # Redis's bucket, with what this process let through that it has not
                # counted (not sent yet: the key's next count).
                bucket.tat_us = now + int(ahead) + bucket.owed * window / quota
        except Exception as error:
            # Those requests went through uncounted, as when the limiter cannot ask Redis
            # (_counted gives back what they owe).
            self._failed(count.key_id, error)
            return
        self._answered(count.key_id)

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
