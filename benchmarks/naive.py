"""Naive baselines for the engine storms: the "seed-blog" way, without Lua.

Each operation takes a per-object mutex with `SET key token NX PX 100`, retries a few
times with a 1 ms sleep and otherwise gives up with "too many people"; inside the
mutex it reads and writes with separate round trips, then releases the mutex with a
plain DEL (which may delete another holder's mutex once the 100 ms have run out).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

MUTEX_PX_MS, RETRIES, RETRY_SLEEP_S = 100, 10, 0.001


class TooManyPeople(Exception):
    """The mutex stayed taken through every retry: the classic spurious failure."""


@asynccontextmanager
async def mutex(redis: Any, key: str) -> AsyncIterator[None]:
    """SETNX-style mutex with a short retry loop; released with a plain DEL."""
    token = secrets.token_hex(4)
    for _ in range(RETRIES):
        if await redis.set(key, token, nx=True, px=MUTEX_PX_MS):
            break
        await asyncio.sleep(RETRY_SLEEP_S)
    else:
        raise TooManyPeople(key)
    try:
        yield
    finally:
        await redis.delete(key)


async def guarded(call: Awaitable[Any]) -> Any:
    """The call's answer, or "too_many_people"."""
    try:
        return await call
    except TooManyPeople:
        return "too_many_people"


class NaivePackets:
    """Red packets: a list of pre-drawn shares and a hash of grabs, guarded by a mutex."""

    def __init__(self, redis: Any, prefix: str = "nv") -> None:
        self.redis, self.prefix = redis, prefix

    def _key(self, packet_id: str, part: str) -> str:
        return f"{self.prefix}:{{p:{packet_id}}}:{part}"

    async def create(self, packet_id: str, shares: list[int]) -> None:
        """Queue the shares of a new packet."""
        await self.redis.rpush(self._key(packet_id, "shares"), *shares)

    async def _grab(self, packet_id: str, user_id: str) -> dict[str, Any]:
        grabs, shares = self._key(packet_id, "grabs"), self._key(packet_id, "shares")
        async with mutex(self.redis, self._key(packet_id, "mutex")):
            if await self.redis.hexists(grabs, user_id):
                amount = int(await self.redis.hget(grabs, user_id))
                return {"status": "already_grabbed", "amount_cents": amount}
            if not await self.redis.llen(shares):
                return {"status": "sold_out"}
            share = await self.redis.lpop(shares)
            if share is None:
                return {"status": "sold_out"}
            await self.redis.hset(grabs, user_id, share)
            return {"status": "grabbed", "amount_cents": int(share)}

    async def grab(self, packet_id: str, user_id: str) -> dict[str, Any]:
        """{"status": grabbed|already_grabbed|sold_out|too_many_people, "amount_cents"?}."""
        answer = await guarded(self._grab(packet_id, user_id))
        return {"status": answer} if isinstance(answer, str) else dict(answer)

    async def left(self, packet_id: str) -> list[int]:
        """The shares still queued."""
        return [int(a) for a in await self.redis.lrange(self._key(packet_id, "shares"), 0, -1)]


class NaiveTeams:
    """Seat locks: INCR-style counters read and written under a per-team mutex.

    Per team: `members` and `locked` counters plus a `lockers` set (what the snapshot
    reads); per user: the team they hold a lock in. Switching teams locks the new team
    first and releases the old one afterwards, in a second critical section. Every call
    answers an outcome string, "too_many_people" when the mutex stayed taken.
    """

    EXPECTED = {"team_full"}

    def __init__(self, redis: Any, size: int, prefix: str = "nv") -> None:
        self.redis, self.size, self.prefix = redis, size, prefix

    def key(self, activity_id: str, team_id: str, part: str) -> str:
        """A key of one team."""
        return f"{self.prefix}:{{a:{activity_id}}}:team:{team_id}:{part}"

    def _user(self, activity_id: str, user_id: str) -> str:
        return f"{self.prefix}:{{a:{activity_id}}}:user:{user_id}:lock"

    async def open_team(self, activity_id: str, team_id: str) -> None:
        """A team with its leader as member 1."""
        await self.redis.set(self.key(activity_id, team_id, "members"), 1)
        await self.redis.set(self.key(activity_id, team_id, "locked"), 0)

    async def _lock(self, aid: str, tid: str, user_id: str) -> str:
        held = await self.redis.get(self._user(aid, user_id))
        if held == tid:
            return "existing"
        async with mutex(self.redis, self.key(aid, tid, "mutex")):
            members = int(await self.redis.get(self.key(aid, tid, "members")) or 0)
            locked = int(await self.redis.get(self.key(aid, tid, "locked")) or 0)
            if members + locked >= self.size:
                return "team_full"
            await self.redis.incr(self.key(aid, tid, "locked"))
            await self.redis.sadd(self.key(aid, tid, "lockers"), user_id)
            await self.redis.set(self._user(aid, user_id), tid)
        if held:
            await self._release(aid, held, user_id, keep_user_key=True)
        return "locked"

    async def _release(self, aid: str, tid: str, user_id: str, keep_user_key: bool = False) -> str:
        async with mutex(self.redis, self.key(aid, tid, "mutex")):
            if not await self.redis.srem(self.key(aid, tid, "lockers"), user_id):
                return "no_lock"
            await self.redis.decr(self.key(aid, tid, "locked"))
            if not keep_user_key:
                await self.redis.delete(self._user(aid, user_id))
            return "unlocked"

    async def _confirm(self, aid: str, tid: str, user_id: str) -> str:
        async with mutex(self.redis, self.key(aid, tid, "mutex")):
            if not await self.redis.srem(self.key(aid, tid, "lockers"), user_id):
                return "lock_required"
            await self.redis.decr(self.key(aid, tid, "locked"))
            await self.redis.incr(self.key(aid, tid, "members"))
            await self.redis.delete(self._user(aid, user_id))
            return "confirmed"

    async def lock(self, aid: str, tid: str, user_id: str) -> str:
        """'locked', 'existing', 'team_full' or 'too_many_people'."""
        return str(await guarded(self._lock(aid, tid, user_id)))

    async def unlock(self, aid: str, tid: str, user_id: str) -> str:
        """'unlocked', 'no_lock' or 'too_many_people'."""
        return str(await guarded(self._release(aid, tid, user_id)))

    async def confirm(self, aid: str, tid: str, user_id: str) -> str:
        """'confirmed', 'lock_required' or 'too_many_people': the lock becomes membership."""
        return str(await guarded(self._confirm(aid, tid, user_id)))

    async def snapshot(self, teams: list[tuple[str, str]]) -> tuple[int, int]:
        """One MULTI read of the teams: (members + lockers > size, users in two lockers sets)."""
        pipe = self.redis.pipeline(transaction=True)
        for aid, tid in teams:
            pipe.get(self.key(aid, tid, "members"))
            pipe.smembers(self.key(aid, tid, "lockers"))
        replies = await pipe.execute()
        holders: Counter[tuple[str, str]] = Counter()
        over = 0
        for index, (aid, _tid) in enumerate(teams):
            members, lockers = int(replies[2 * index] or 0), replies[2 * index + 1]
            holders.update((aid, user) for user in lockers)
            over += members + len(lockers) > self.size
        return over, sum(1 for n in holders.values() if n > 1)
