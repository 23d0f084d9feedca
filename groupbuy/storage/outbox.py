"""The write-behind's one shape: scripts append records to an owner's outbox stream in the
same atomic call as the state change, and a record writer turns them into SQL rows.

Each engine has its writer (teams: groupbuy/locks/writer.py, packets:
groupbuy/redpacket/writer.py), and both answer to `RecordWriter`: `drain(owner)` writes
what one owner (an activity, a packet) has waiting, `drain_all(within)` what every owner
has waiting, within a `RunTime`. Every record carries its own identity (a business key),
so applying it twice changes nothing, and a batch leaves its stream only after its SQL
commit. A record that can never be applied goes to the dead letters
(groupbuy/storage/deadletters.py) without holding up the rest of its batch.

The scripts list each stream that has records waiting in a pending index (a sorted set,
member -> ms of its oldest record), and `outbox_ack` takes it out once the stream is empty,
so `drain_all` visits only the streams with work, however many are idle. In Redis Cluster
there is one pending index per slot (each stream is listed in its own slot's), and the
writers read the index of every slot in use; the same indexes give the backlog gauges.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import ClassVar, Protocol

from groupbuy import metrics
from groupbuy.storage.backends import Backends, UsesBackends
from groupbuy.storage.calls import outbox_read
from groupbuy.storage.deadletters import DeadLetters, StreamKind
from groupbuy.storage.slots import each_slot, oldest_first, oldest_scored
from groupbuy.storage.specs import Scripts, reply_dict

# Most streams one drain_all round visits; the rest wait for the next round.
ROUND_STREAMS = 5000
# XLENs sent in one pipeline when the backlog is measured.
_PIPELINE_CHUNK = 500


async def read_outbox(
    scripts: Scripts, stream: str, first: str, last: str, count: int
) -> list[tuple[str, dict[str, str]]]:
    """Up to `count` entries of an outbox stream, from id `first` to id `last` (inclusive);
    with `[redis] wait_replicas`, only once the replicas hold them, else
    RedisReplicationTimeout: SQL must not take a record that a failover could take back
    from Redis, and a retried grab would then get another share than the row SQL kept."""
    waits = scripts.replica_wait is not None
    entries = await outbox_read(scripts, stream, first=first, last=last, most=count, publish=waits)
    return [(entry_id, reply_dict(fields)) for entry_id, fields in entries]


class OutboxLayout(Protocol):
    """Where an engine keeps its owners' outbox streams and the pending indexes listing them."""

    def stream(self, owner: str) -> str:
        """The outbox stream of one owner."""
        ...

    def index_of(self, owner: str) -> str:
        """The pending index that lists this owner's stream (the one of its slot)."""
        ...

    def index_in(self, slot: int | None) -> str:
        """The pending index of one slot (None: the only one, outside Redis Cluster)."""
        ...


class RecordWriter(UsesBackends, abc.ABC):
    """One engine's write-behind: its owners' outbox streams into SQL, batch by batch."""

    engine: ClassVar[StreamKind]  # "teams" | "packets": the metrics' label, the dead letters'

    def __init__(
        self, backends: Backends, layout: OutboxLayout, batch_size: int, dead_letters: DeadLetters
    ) -> None:
        super().__init__(backends)
        self.layout = layout
        self._batch_size = batch_size
        self._dead = dead_letters

    @abc.abstractmethod
    async def drain(self, owner: str) -> int:
        """Write what `owner`'s stream holds now to SQL; returns how many records it applied."""

    @abc.abstractmethod
    async def drain_all(self, within: RunTime | None = None) -> int:
        """Write what every owner the pending index lists has waiting, oldest record first,
        until `within` runs out (the first step always runs); returns how many records were
        applied."""

    def _written(self, applied: int) -> int:
        """Count records applied to SQL in the metrics; returns `applied`."""
        if applied:
            metrics.WRITEBACK_RECORDS.labels(engine=self.engine).inc(applied)
        return applied

    async def pending(self, limit: int = ROUND_STREAMS) -> list[str]:
        """The owners whose streams have records waiting, oldest record first (at most
        `limit`, over the pending index of every slot in use)."""
        indexes = [self.layout.index_in(slot) for slot in await self._slots.in_use()]
        return await oldest_first(self._redis, indexes, limit)

    async def measure_backlog(self, most: int = ROUND_STREAMS) -> tuple[int, int | None, int]:
        """(records waiting, ms timestamp of the oldest one or None, streams with records).

        From the pending index (of every slot in use): its size is the number of streams, its
        lowest score the oldest waiting record; written records are deleted, so the lengths
        of the listed streams are the records. One round trip when nothing waits (per node
        in Redis Cluster); else one more for the `most` oldest streams and a pipelined XLEN
        of each: beyond `most` streams the records are a lower bound (the `most` oldest
        streams' records).
        """
        indexes = [self.layout.index_in(slot) for slot in await self._slots.in_use()]
        sizes = await each_slot(self._redis, indexes, lambda pipe, key: pipe.zcard(key))
        streams = sum(int(size) for size in sizes)
        if not streams:
            return 0, None, 0
        oldest = await oldest_scored(self._redis, indexes, most)
        if not oldest:  # drained since
            return 0, None, 0
        records = 0
        for start in range(0, len(oldest), _PIPELINE_CHUNK):
            async with self._redis.pipeline(transaction=False) as pipe:
                for owner, _score in oldest[start : start + _PIPELINE_CHUNK]:
                    pipe.xlen(self.layout.stream(owner))
                records += sum(int(length) for length in await pipe.execute())
        return records, int(oldest[0][1]), streams

    async def backlog(self) -> int:
        """Records written by scripts and not yet in SQL."""
        return (await self.measure_backlog())[0]


class RunTime:
    """The time a drain run may take: `seconds` from now, or no limit (None).

    A run asks `allows()` before each step after its first (so every run moves), and a step
    is allowed only while it would end in time, judged by the slowest step so far: a run
    that must end before the scheduler's next tick then ends before it, unless one step is
    slower than the whole time.
    """

    def __init__(self, seconds: float | None = None) -> None:
        self._deadline = None if seconds is None else time.monotonic() + seconds
        self._slowest = 0.0
        self.ran_out = False  # a step was refused: work was left for the next run

    def allows(self) -> bool:
        """Whether another step fits in the time left (always, without a limit)."""
        if self._deadline is not None and time.monotonic() + self._slowest > self._deadline:
            self.ran_out = True
        return not self.ran_out

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Time one step (a batch, a stream's drain) for the estimate `allows()` makes."""
        began = time.monotonic()
        try:
            yield
        finally:
            self._slowest = max(self._slowest, time.monotonic() - began)


async def drain_each(
    owners: Iterable[str], drain: Callable[[str], Awaitable[int]], within: RunTime | None = None
) -> int:
    """Run `drain` on each owner in turn (the first failure stops the round, as SQL or
    Redis being down fails every one), until `within` runs out (the first always runs);
    returns how many records were applied."""
    within = within or RunTime()
    applied = 0
    for count, owner in enumerate(owners):
        if count and not within.allows():
            break
        with within.step():
            applied += await drain(owner)
    return applied
