"""The open-seat index of an activity, read as it is and recomputed from the teams' own keys."""

from __future__ import annotations

from typing import Any

from groupbuy.locks.codec import seat_score
from groupbuy.storage.keys import Keys


async def indexed_open_seats(redis: Any, keys: Keys, activity_id: str) -> dict[str, int]:
    """team_id -> score, as the activity's open-seat index holds them."""
    entries = await redis.zrange(keys.open_seats(activity_id), 0, -1, withscores=True)
    return {team_id: int(score) for team_id, score in entries}


async def recomputed_open_seats(redis: Any, keys: Keys, activity_id: str) -> dict[str, int]:
    """team_id -> seat score of every team of the activity that Redis holds as open with a free
    seat, found by scanning the keyspace (not through any index) and counting seats as stored:
    members, and locks whether or not they have expired unswept."""
    prefix = keys.team_key_prefix(activity_id)
    found: dict[str, int] = {}
    async for key in redis.scan_iter(match=f"{prefix}*", count=1000):
        team_id = key[len(prefix) :]
        if ":" in team_id:  # a team's members hash or locks zset (ids have no ':')
            continue
        status, size, members, created = await redis.hmget(
            key, "status", "size", "member_count", "created_ms"
        )
        if status != "open":
            continue
        taken = int(members) + await redis.zcard(keys.team_locks(activity_id, team_id))
        if taken < int(size):
            found[team_id] = seat_score(taken, int(created))
    return found
