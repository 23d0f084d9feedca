"""Naive baselines for the engine benchmark: the "seed-blog" way, without Lua.

Each operation takes a per-object mutex with `SET key token NX PX 100`, retries a few
times with a 1 ms sleep and otherwise gives up with "too many people"; inside the
mutex it reads and writes with separate round trips, then releases the mutex with a
plain DEL (which may delete another holder's mutex once the 100 ms have run out).

Used by the engine-level scenarios (benchmarks/engine/); not part of the service.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

MUTEX_PX_MS = 100
RETRIES = 10
RETRY_SLEEP_S = 0.001


class TooManyPeople(Exception):
    """The mutex stayed taken through every retry: the classic spurious failure."""


@asynccontextmanager
async def mutex(redis: Any, key: str, retries: int = RETRIES) -> AsyncIterator[None]:
    """SETNX-style mutex with a short retry loop; released with a plain DEL."""
    token = secrets.token_hex(4)
    for _ in range(retries):
        if await redis.set(key, token, nx=True, px=MUTEX_PX_MS):
            break
        await asyncio.sleep(RETRY_SLEEP_S)
    else:
        raise TooManyPeople(key)
    try:
        yield
    finally:
        await redis.delete(key)


class NaivePackets:
    """Red packets: a list of pre-drawn shares and a hash of grabs, guarded by a mutex."""

    def __init__(self, redis: Any, prefix: str = "nv") -> None:
        self.redis = redis
        self.prefix = prefix

    def _key(self, packet_id: str, part: str) -> str:
        return f"{self.prefix}:{{p:{packet_id}}}:{part}"

    async def create(self, packet_id: str, shares: list[int]) -> None:
        """Queue the shares of a new packet."""
        await self.redis.rpush(self._key(packet_id, "shares"), *shares)

    async def grab(self, packet_id: str, user_id: str) -> dict[str, Any]:
        """{"status": grabbed|already_grabbed|sold_out|too_many_people, "amount_cents"?}."""
        grabs = self._key(packet_id, "grabs")
        shares = self._key(packet_id, "shares")
        try:
            async with mutex(self.redis, self._key(packet_id, "mutex")):
                if await self.redis.hexists(grabs, user_id):
                    return {
                        "status": "already_grabbed",
                        "amount_cents": int(await self.redis.hget(grabs, user_id)),
                    }
                if not await self.redis.llen(shares):
                    return {"status": "sold_out"}
                share = await self.redis.lpop(shares)
                if share is None:
                    return {"status": "sold_out"}
                await self.redis.hset(grabs, user_id, share)
                return {"status": "grabbed", "amount_cents": int(share)}
        except TooManyPeople:
            return {"status": "too_many_people"}

    async def state(self, packet_id: str) -> tuple[dict[str, int], list[int]]:
        """The recorded grabs and the shares still queued."""
        grabs = await self.redis.hgetall(self._key(packet_id, "grabs"))
        left = await self.redis.lrange(self._key(packet_id, "shares"), 0, -1)
        return {u: int(a) for u, a in grabs.items()}, [int(a) for a in left]


class NaiveTeams:
    """Seat locks: INCR-style counters read and written under a per-team mutex.

    Per team: `members` and `locked` counters plus a `lockers` set (what the snapshot
    check reads); per user: the team they hold a lock in. Switching teams locks the new
    team first and releases the old one afterwards, in a second critical section.
    """

    def __init__(self, redis: Any, size: int, prefix: str = "nv") -> None:
        self.redis = redis
        self.size = size
        self.prefix = prefix

    def key(self, activity_id: str, team_id: str, part: str) -> str:
        """A key of one team."""
        return f"{self.prefix}:{{a:{activity_id}}}:team:{team_id}:{part}"

    def _user(self, activity_id: str, user_id: str) -> str:
        return f"{self.prefix}:{{a:{activity_id}}}:user:{user_id}:lock"

    async def open_team(self, activity_id: str, team_id: str) -> None:
        """A team with its leader as member 1."""
        await self.redis.set(self.key(activity_id, team_id, "members"), 1)
        await self.redis.set(self.key(activity_id, team_id, "locked"), 0)

    async def lock(self, activity_id: str, team_id: str, user_id: str) -> str:
        """'locked', 'existing' or 'team_full'; raises TooManyPeople."""
        held = await self.redis.get(self._user(activity_id, user_id))
        if held == team_id:
            return "existing"
        async with mutex(self.redis, self.key(activity_id, team_id, "mutex")):
            members = int(await self.redis.get(self.key(activity_id, team_id, "members")) or 0)
            locked = int(await self.redis.get(self.key(activity_id, team_id, "locked")) or 0)
            if members + locked >= self.size:
                return "team_full"
            await self.redis.incr(self.key(activity_id, team_id, "locked"))
            await self.redis.sadd(self.key(activity_id, team_id, "lockers"), user_id)
            await self.redis.set(self._user(activity_id, user_id), team_id)
        if held:
            await self._release(activity_id, held, user_id, keep_user_key=True)
        return "locked"

    async def _release(
        self, activity_id: str, team_id: str, user_id: str, keep_user_key: bool = False
    ) -> bool:
        async with mutex(self.redis, self.key(activity_id, team_id, "mutex")):
            if not await self.redis.srem(self.key(activity_id, team_id, "lockers"), user_id):
                return False
            await self.redis.decr(self.key(activity_id, team_id, "locked"))
            if not keep_user_key:
                await self.redis.delete(self._user(activity_id, user_id))
            return True

    async def unlock(self, activity_id: str, team_id: str, user_id: str) -> bool:
        """Release the user's lock; False when there was none."""
        return await self._release(activity_id, team_id, user_id)

    async def confirm(self, activity_id: str, team_id: str, user_id: str) -> str:
        """'confirmed' or 'lock_required': the lock becomes membership."""
        async with mutex(self.redis, self.key(activity_id, team_id, "mutex")):
            if not await self.redis.srem(self.key(activity_id, team_id, "lockers"), user_id):
                return "lock_required"
            await self.redis.decr(self.key(activity_id, team_id, "locked"))
            await self.redis.incr(self.key(activity_id, team_id, "members"))
            await self.redis.delete(self._user(activity_id, user_id))
            return "confirmed"
