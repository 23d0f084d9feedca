"""The slots in use under Redis Cluster, and reading one index in each of them.

In Redis Cluster every index of waiting work and the copy of the blocked users exist once
per slot (groupbuy/storage/keys.py), so that a script's keys stay in its entity's slot.
The jobs and the write-behind then need to know which slots may hold work: the directory
(`Keys.slot_directory`, a set of slot numbers) lists every slot that ever held an
activity, a packet or a sender's counters. A slot joins it before the first key of such
an entity is written there (an activity put in Redis, a packet created or rebuilt, a
sender's first send), and never leaves it: at most 16,384 members, and a slot listed but
empty only costs one read per index per round.

Joining also gives the slot its copy of the blocked users, made from the one hash under
the blocklist's lock (`BLOCKLIST_LOCK`, the lock every block and unblock holds while it
writes the copy of every slot in the directory), and only then is the slot added: a
script can run in a slot only once its copy exists, and a block either finds the slot
in the directory or happened before its copy was made.

On one Redis server (`Keys.cluster` false) there is one index of each kind and one
hash of blocked users: the directory is not used, and `in_use` is `[None]`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any

from groupbuy.storage.keys import Keys

# The name of the lease the blocklist's changes, rebuilds and slot joins take turns on.
BLOCKLIST_LOCK = "blocklist"
# How long one holder may keep that lock, and how long a caller waits for it: longer than a
# holder may keep it, so a process killed while holding it (its lock left to expire) delays
# the next block, unblock or repair run instead of failing it.
LOCK_TIMEOUT_S = 8.0
LOCK_WAIT_S = LOCK_TIMEOUT_S + 4.0
# Commands per pipeline when reading or writing one key in each of many slots.
PIPELINE_CHUNK = 2000


class SlotDirectory:
    """The slots that may hold work (Redis Cluster), and joining a slot to them."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    def blocklist_lock(self) -> Any:
        """The lock under which the blocked users' copies change (a block, an unblock, a
        rebuild, a slot's first copy), so that none of them writes back a stale list."""
        return self._redis.lock(
            self._keys.lease(BLOCKLIST_LOCK), timeout=LOCK_TIMEOUT_S, blocking_timeout=LOCK_WAIT_S
        )

    async def in_use(self) -> list[int | None]:
        """Every slot in the directory, in order; `[None]` on one Redis server."""
        if not self._keys.cluster:
            return [None]
        members = await self._redis.smembers(self._keys.slot_directory())
        slots: list[int | None] = [slot for slot in sorted(int(slot) for slot in members)]
        return slots

    async def join(self, *slots: int | None) -> list[int]:
        """Make sure these slots are in the directory, each with its copy of the blocked
        users; returns the slots this call added. One round trip when all are in already
        (and none on one Redis server)."""
        wanted = sorted({slot for slot in slots if slot is not None})
        if not wanted:
            return []
        directory = self._keys.slot_directory()
        listed = await self._redis.smismember(directory, wanted)
        missing = [slot for slot, there in zip(wanted, listed, strict=True) if not int(there)]
        if not missing:
            return []
        async with self.blocklist_lock():
            users = await self._redis.hgetall(self._keys.blocked_users())
            await self.write_copies(missing, dict.fromkeys(users, COPY_VALUE))
            await self._redis.sadd(directory, *missing)
        return missing

    async def write_copies(self, slots: list[int], users: dict[str, str]) -> None:
        """Make each slot's copy of the blocked users hold exactly `users` (call it under
        the blocklist's lock): written first, then what it held beyond them removed, so a
        user blocked in both is never missing from it meanwhile."""
        keys = [self._keys.blocked_users(slot) for slot in slots]
        held = await each_slot(self._redis, keys, lambda pipe, key: pipe.hkeys(key))
        async with self._redis.pipeline(transaction=False) as pipe:
            queued = 0
            for key, fields in zip(keys, held, strict=True):
                if users:
                    pipe.hset(key, mapping=users)
                    queued += 1
                stale = [field for field in fields if field not in users]
                if stale:
                    pipe.hdel(key, *stale)
                    queued += 1
                if queued >= PIPELINE_CHUNK:
                    await pipe.execute()
                    queued = 0
            if queued:
                await pipe.execute()


# What a slot's copy keeps of a blocked user. The scripts only test that the field exists,
# and the copies multiply by the slots in use: on a 3-master cluster with all 16,384 slots
# in use, the ms the block began cost 34.5 B per user per slot and "1" 26.5 B (the time
# and the reason stay in the one hash and in SQL; docs/architecture.md, "Blocked users").
COPY_VALUE = "1"


async def each_slot(redis: Any, keys: list[str], command: Callable[[Any, str], Any]) -> list[Any]:
    """Run `command(pipe, key)` for every key, pipelined (a cluster pipeline routes each
    command to its slot's node), and return the replies in the order of `keys`. One round
    trip per node for up to PIPELINE_CHUNK keys."""
    replies: list[Any] = []
    for start in range(0, len(keys), PIPELINE_CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for key in keys[start : start + PIPELINE_CHUNK]:
                command(pipe, key)
            replies += await pipe.execute()
    return replies


async def oldest_first(redis: Any, indexes: Iterable[str], limit: int) -> list[str]:
    """The members of the lowest scores over several sorted sets (the pending index of each
    slot): at most `limit`, oldest first, as one ZRANGE of one index would list them."""
    keys = list(indexes)
    if len(keys) == 1:
        return list(await redis.zrange(keys[0], 0, limit - 1))
    return [member for member, _score in await oldest_scored(redis, keys, limit)]


async def oldest_scored(redis: Any, indexes: Iterable[str], limit: int) -> list[tuple[str, float]]:
    """`oldest_first` with each member's score."""
    replies = await each_slot(
        redis, list(indexes), lambda pipe, key: pipe.zrange(key, 0, limit - 1, withscores=True)
    )
    merged = heapq.merge(*replies, key=lambda entry: (float(entry[1]), entry[0]))
    return [(member, float(score)) for member, score in itertools.islice(merged, limit)]


async def due_in(redis: Any, indexes: list[str], until: int, count: int) -> list[list[str]]:
    """For each sorted set, its first `count` members scored up to `until` (what a due index
    lists as due), in the order of `indexes`."""
    return await each_slot(
        redis, indexes, lambda pipe, key: pipe.zrangebyscore(key, "-inf", until, start=0, num=count)
    )
