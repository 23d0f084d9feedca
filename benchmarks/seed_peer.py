"""The seed-style Lua peer: a grab and a seat lock as the seed articles write them.

Each operation is one EVALSHA of a short plain script, called through redis-py's asyncio
client the ordinary way (`script = redis.register_script(...)`, `await script(keys=...,
args=...)`) on one client with its default connection pool. Correct under concurrency
(a script runs alone), but without what the service adds: no outbox stream, no expiry or
status checks, no user-lock key (a user could hold seats in two teams), the lock time
from the caller's clock. The engine benchmark compares the service's engine with it at
the same concurrency, on the same redis-server, in alternating rounds.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis

# KEYS[1] grabbed hash (user -> amount)  KEYS[2] pre-split amounts list  KEYS[3] records list
# ARGV[1] user_id.  Returns -1 already grabbed, 0 sold out, else the amount.
GRAB_SCRIPT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return -1
end
local amount = redis.call('RPOP', KEYS[2])
if not amount then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], amount)
redis.call('LPUSH', KEYS[3], ARGV[1] .. ':' .. amount)
return tonumber(amount)
"""

# KEYS[1] the team's locks zset (member user, score expiry ms)
# ARGV[1] user_id  ARGV[2] now ms  ARGV[3] lock ttl ms  ARGV[4] seats.  Returns 1 locked, 0 full.
LOCK_SCRIPT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('ZADD', KEYS[1], tonumber(ARGV[2]) + tonumber(ARGV[3]), ARGV[1])
return 1
"""

LOCK_TTL_MS = 300_000


class SeedPeer:
    """Grabs and seat locks by one plain EVALSHA each, on a client of its own."""

    def __init__(self, url: str, prefix: str = "seed") -> None:
        self.redis = aioredis.Redis.from_url(url, decode_responses=True)
        self.prefix = prefix
        self._grab = self.redis.register_script(GRAB_SCRIPT)
        self._lock = self.redis.register_script(LOCK_SCRIPT)

    def packet_keys(self, packet_id: str) -> list[str]:
        """The grabbed hash, the amounts list and the records list of a packet."""
        return [f"{self.prefix}:{{p:{packet_id}}}:{part}" for part in ("grabbed", "amounts", "log")]

    def team_key(self, activity_id: str, team_id: str) -> str:
        """A team's locks zset."""
        return f"{self.prefix}:{{t:{activity_id}:{team_id}}}:locks"

    async def create_packet(self, packet_id: str, amounts: list[int]) -> None:
        """Queue the pre-split amounts of a new packet."""
        await self.redis.rpush(self.packet_keys(packet_id)[1], *amounts)

    async def grab(self, packet_id: str, user_id: str) -> dict[str, Any]:
        """{"status": grabbed|already_grabbed|sold_out, "amount_cents"?}; a repeat learns no
        amount."""
        amount = int(await self._grab(keys=self.packet_keys(packet_id), args=[user_id]))
        if amount > 0:
            return {"status": "grabbed", "amount_cents": amount}
        return {"status": "already_grabbed" if amount < 0 else "sold_out"}

    async def lock(self, activity_id: str, team_id: str, user_id: str, seats: int) -> str:
        """ "locked" or "team_full"."""
        now = int(time.time() * 1000)
        key = self.team_key(activity_id, team_id)
        locked = await self._lock(keys=[key], args=[user_id, now, LOCK_TTL_MS, seats])
        return "locked" if int(locked) else "team_full"

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.redis.aclose()
