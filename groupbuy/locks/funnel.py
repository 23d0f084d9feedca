"""The sale's funnel: what became of an activity's seat locks, minute by minute, for the
console ("how is the sale going").

Nothing here runs inside a script: every command there costs Redis time per lock. Each
outcome is counted once, where its one path passes in Python:

- `taken`, `released` and `refused.<code>`: by the seat operations (`counts_seats` on the
  lock and the join, `counts_release` on the unlock), as they answer;
- `confirmed`, `expired` and `offered`: from the events of the scripts' outbox records
  (`team.member_joined`, `lock.expired` by the lazy purge or the sweep, `lock.offered` by
  the waitlist), once the write-behind's SQL transaction that applied them commits. A
  record may be applied more than once (two processes drain one stream at once, a batch
  is retried): these count their events' dedup keys, as digests in a set, not applications.

A process adds to its `TALLY` in memory; its `FunnelFlusher` moves the tally to Redis every
`FLUSH_INTERVAL_S` in one pipeline: HINCRBY into the activity's hash of the minute and SADD
into its sets of digests (`Keys.funnel`, in the activity's slot), each with an EXPIRE, so
they go `KEEP_S` after their last count (SPEC §4.9). Every worker and replica adds to the
same keys: the console reads their sum. A crash loses what the tally held (at most
`FLUSH_INTERVAL_S` of counts). The console reads one activity's last `WINDOW_MINUTES` with
one pipeline of HGETALL and SCARD (`FunnelStore.window`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from sqlalchemy import event as orm_events
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy import errors
from groupbuy.storage.clock import RedisClock
from groupbuy.storage.events import Event
from groupbuy.storage.keys import Keys

log = logging.getLogger(__name__)

WINDOW_MINUTES = 10  # the console shows the current minute and the nine before it
MINUTE_MS = 60_000
# A minute's hash outlives its last count by the window shown and one minute more: it is
# gone before anyone could read it again, and memory returns to its baseline after a sale.
KEEP_S = (WINDOW_MINUTES + 1) * 60
FLUSH_INTERVAL_S = 1.0  # counts wait in a process's memory at most this long
STOP_WAIT_S = 2.0  # the most a stop waits for the flusher and its last flush (Redis away)

TAKEN = "taken"  # a new seat lock (a lock or a join), not a repeat of one
OFFERED = "offered"  # a seat lock the waitlist gave the first user of its line
CONFIRMED = "confirmed"  # a lock confirmed: its user became a member
EXPIRED = "expired"  # a lock whose time ran out (lazily inside a script, or by the sweep)
RELEASED = "released"  # a lock given back: an unlock, or a lock the user moved elsewhere
REFUSED = "refused."  # a refused lock or join: the problem's code follows
OUTCOMES = (TAKEN, OFFERED, CONFIRMED, EXPIRED, RELEASED)
"""Every outcome but the refusals, in the order the console shows them."""

_FROM_EVENTS = {"team.member_joined": CONFIRMED, "lock.expired": EXPIRED, "lock.offered": OFFERED}
DIGEST_BYTES = 8  # an event's digest: collisions are ~1e-9 likely at 100,000 a minute

# (activity id, minute or None: the minute of the flush, outcome)
_Slot = tuple[str, int | None, str]


@dataclass
class Counts:
    """Counts by slot, and the digests of the events counted once each by slot."""

    plain: Counter[_Slot] = field(default_factory=Counter)
    events: dict[_Slot, set[bytes]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.plain or self.events)

    def update(self, other: Counts) -> None:
        """Add `other`'s counts to these."""
        self.plain.update(other.plain)
        for slot, digests in other.events.items():
            self.events.setdefault(slot, set()).update(digests)


class Tally:
    """What one process counted since its last flush."""

    def __init__(self) -> None:
        self._counts = Counts()

    def add(self, activity_id: str, outcome: str, at_ms: int | None = None) -> None:
        """Count one outcome: in the minute of `at_ms` (Redis's clock) or, without it, in the
        minute the count reaches Redis (at most a second later)."""
        minute = None if at_ms is None else at_ms // MINUTE_MS
        self._counts.plain[(activity_id, minute, outcome)] += 1

    def add_event(self, activity_id: str, outcome: str, event: Event) -> None:
        """Count an event's outcome once in its minute, however often it is counted."""
        digest = hashlib.blake2b(event.dedup_key.encode(), digest_size=DIGEST_BYTES).digest()
        slot = (activity_id, event.at_ms // MINUTE_MS, outcome)
        self._counts.events.setdefault(slot, set()).add(digest)

    def take(self) -> Counts:
        """Everything counted so far; the tally starts again from nothing."""
        taken, self._counts = self._counts, Counts()
        return taken

    def put_back(self, counts: Counts) -> None:
        """Counts a flush could not write: the next flush tries them again."""
        self._counts.update(counts)


TALLY = Tally()
"""The process's tally, as prometheus-client's registry is the process's metrics: the seat
operations and the write-behind add to it wherever they were built."""


class _Outcome(Protocol):
    """A lock's or a join's answer (`Outcome`): its body, and whether the call created it."""

    @property
    def body(self) -> Mapping[str, Any]: ...

    @property
    def created(self) -> bool: ...


S = TypeVar("S")
P = ParamSpec("P")
A = TypeVar("A", bound=_Outcome)


def counts_seats(
    call: Callable[Concatenate[S, str, P], Awaitable[A]],
) -> Callable[Concatenate[S, str, P], Awaitable[A]]:
    """Count a lock's or join's answer in its activity's funnel (the activity id is the first
    argument): a new lock as `taken` (and the lock it moved from as `released`), a refusal
    as `refused.<code>`; a repeat (the user's existing lock) counts nothing."""

    @functools.wraps(call)
    async def counted(self: S, activity_id: str, /, *args: P.args, **kwargs: P.kwargs) -> A:
        try:
            answer = await call(self, activity_id, *args, **kwargs)
        except errors.GroupBuyError as exc:
            TALLY.add(activity_id, REFUSED + exc.code)
            raise
        if answer.created:
            TALLY.add(activity_id, TAKEN)
            if answer.body.get("released_team_id"):
                TALLY.add(activity_id, RELEASED)
        return answer

    return counted


def counts_release(
    call: Callable[Concatenate[S, str, P], Awaitable[bool]],
) -> Callable[Concatenate[S, str, P], Awaitable[bool]]:
    """Count an unlock that released a live lock as `released` in its activity's funnel."""

    @functools.wraps(call)
    async def counted(self: S, activity_id: str, /, *args: P.args, **kwargs: P.kwargs) -> bool:
        released = await call(self, activity_id, *args, **kwargs)
        if released:
            TALLY.add(activity_id, RELEASED)
        return released

    return counted


def count_when_committed(session: AsyncSession, events: Iterable[Event]) -> None:
    """Count the funnel's events of a write-behind batch once `session`'s transaction
    commits (a batch rolled back counts nothing; one applied again, nothing more)."""
    counted = [event for event in events if event.type in _FROM_EVENTS]
    if not counted:
        return

    def committed(_session: Any) -> None:
        count_committed(counted)

    orm_events.listen(session.sync_session, "after_commit", committed, once=True)


def count_committed(events: Iterable[Event]) -> None:
    """Count the funnel's events of a write-behind batch that has committed."""
    for event in events:
        if event.type in _FROM_EVENTS:
            TALLY.add_event(str(event.data["activity_id"]), _FROM_EVENTS[event.type], event)


@dataclass(frozen=True)
class Window:
    """An activity's funnel over the last minutes: each outcome's count, refusals by code."""

    minutes: int
    counts: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        """How many of `outcome` the window holds."""
        return self.counts.get(outcome, 0)

    @property
    def locks(self) -> int:
        """Locks that began in the window: taken by a lock or a join, or offered by a line."""
        return self.count(TAKEN) + self.count(OFFERED)

    def share(self, outcome: str) -> float | None:
        """`outcome` per lock begun in the window, as a percentage to a tenth (None without
        locks); a whole one is an int, written alike by Python and by the page's script."""
        if not self.locks:
            return None
        share = round(100 * self.count(outcome) / self.locks, 1)
        return int(share) if share.is_integer() else share


class FunnelStore:
    """The funnel's hashes in Redis: a tally written in, one activity's window read out."""

    def __init__(self, redis: Any, keys: Keys, clock: RedisClock) -> None:
        self._redis = redis
        self._keys = keys
        self._clock = clock

    async def flush(self, tally: Tally = TALLY) -> int:
        """Write what `tally` holds in one pipeline; returns how many counts it wrote. A
        count of a minute no longer shown is left out; on failure, the counts go back."""
        counts = tally.take()
        if not counts:
            return 0
        try:
            return await self._write(counts)
        except BaseException:
            tally.put_back(counts)
            raise

    async def _write(self, counts: Counts) -> int:
        now = await self._clock.now_ms(self._redis) // MINUTE_MS
        shown = now - WINDOW_MINUTES  # a minute at or before this one is shown no more
        hashes: dict[str, Counter[str]] = {}
        for (activity_id, minute, outcome), number in counts.plain.items():
            minute = now if minute is None else minute
            if minute > shown:
                key = self._keys.funnel(activity_id, minute)
                hashes.setdefault(key, Counter())[outcome] += number
        sets = {
            self._keys.funnel(activity_id, minute, outcome): digests
            for (activity_id, minute, outcome), digests in counts.events.items()
            if minute is not None and minute > shown
        }
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, fields in hashes.items():
                for outcome, number in fields.items():
                    pipe.hincrby(key, outcome, number)
                pipe.expire(key, KEEP_S)
            for key, digests in sets.items():
                pipe.sadd(key, *digests)
                pipe.expire(key, KEEP_S)
            await pipe.execute()
        written = sum(sum(fields.values()) for fields in hashes.values())
        return written + sum(len(digests) for digests in sets.values())

    async def window(self, activity_id: str) -> Window:
        """The activity's funnel over the current minute and the ones before it
        (`WINDOW_MINUTES` in all): a TIME and one pipeline of HGETALL and SCARD, in its
        slot."""
        now = await self._clock.now_ms(self._redis) // MINUTE_MS
        once = tuple(_FROM_EVENTS.values())
        async with self._redis.pipeline(transaction=False) as pipe:
            for minute in range(now - WINDOW_MINUTES + 1, now + 1):
                pipe.hgetall(self._keys.funnel(activity_id, minute))
                for outcome in once:
                    pipe.scard(self._keys.funnel(activity_id, minute, outcome))
            replies = await pipe.execute()
        totals: Counter[str] = Counter()
        step = 1 + len(once)
        for at in range(0, len(replies), step):
            bucket, cards = replies[at], replies[at + 1 : at + step]
            totals.update({_text(name): int(value) for name, value in bucket.items()})
            totals.update(dict(zip(once, (int(card) for card in cards), strict=True)))
        refused = {
            name.removeprefix(REFUSED): number
            for name, number in sorted(totals.items())
            if name.startswith(REFUSED)
        }
        counts = {name: totals[name] for name in OUTCOMES}
        return Window(WINDOW_MINUTES, counts, refused)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class FunnelFlusher:
    """Moves the process's tally to Redis every `interval_s` while the services run; one
    flush at a time (a flush asked for waits for the one under way: then its counts are
    in Redis)."""

    def __init__(self, store: FunnelStore, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.store = store
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._flushing: asyncio.Lock | None = None
        self._stopping = False

    def start(self) -> None:
        """Start flushing. What the tally held before belongs to no running service of this
        process (a test's services that never ran): it is dropped, not written here."""
        TALLY.take()
        self._flushing = asyncio.Lock()
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="funnel-flusher")

    async def flush(self) -> int:
        """Write what the tally holds now; returns how many counts went to Redis."""
        if self._flushing is None:
            return await self.store.flush()
        async with self._flushing:
            return await self.store.flush()

    async def stop(self) -> None:
        """Stop, writing what is left: best effort, within STOP_WAIT_S (Redis may be away by
        now, and a shutdown must not wait on it)."""
        if self._task is None:
            return
        self._stopping = True  # even should a Redis call swallow the cancellation
        self._task.cancel()
        await asyncio.wait({self._task}, timeout=STOP_WAIT_S)
        self._task = None
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), STOP_WAIT_S)

    async def _run(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._interval_s)
            try:
                await self.flush()
            except Exception:  # Redis away: the counts wait for the next flush
                log.debug("could not flush the funnel's counts", exc_info=True)
