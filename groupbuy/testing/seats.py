"""Seats as Redis holds them at one instant, for the race tests and the lock benchmarks."""

from __future__ import annotations

from typing import Any

from groupbuy.storage.keys import Keys

# TIME, then each team's locks and seat fields, read in one script: an instant of the state
# that also holds on Redis Cluster, where a MULTI cannot carry TIME (it has no key) and
# an activity's keys share one slot (so the teams read together must be of one activity).
_READ = """
local out = {redis.call('TIME')}
for i = 1, #KEYS, 2 do
  out[#out + 1] = redis.call('ZRANGE', KEYS[i], 0, -1, 'WITHSCORES')
  out[#out + 1] = redis.call('HMGET', KEYS[i + 1], 'member_count', 'size', 'status',
                             'lock_ttl_ms')
end
return out
"""


async def read_seats(
    redis: Any, keys: Keys, shift_ms: int, teams: list[tuple[str, str]]
) -> tuple[int, list[Any]]:
    """(now in ms as the scripts see it, [locks, fields] per team): each team's locks as
    (user, locked_at_ms) pairs and its member_count, size, status and lock_ttl_ms."""
    names = [
        name for aid, tid in teams for name in (keys.team_locks(aid, tid), keys.team(aid, tid))
    ]
    (seconds, micros), *rest = await redis.eval(_READ, len(names), *names)
    now_ms = int(seconds) * 1000 + int(micros) // 1000 + shift_ms
    replies: list[Any] = []
    for flat, fields in zip(rest[0::2], rest[1::2], strict=True):
        pairs = zip(flat[0::2], flat[1::2], strict=True)
        replies.append([(user, float(score)) for user, score in pairs])
        replies.append(fields)
    return now_ms, replies
