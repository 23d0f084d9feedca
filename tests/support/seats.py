"""Seats as Redis holds them: an instant of every team's seats (checked against SPEC §4), and
the open-seat index of an activity, read as it is and recomputed from the teams' own keys.
The lock benchmarks read their instants with `read_seats` too."""

from __future__ import annotations

from collections import Counter
from typing import Any

from groupbuy.locks.codec import seat_score
from groupbuy.services import Services
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


async def seat_snapshot(
    redis: Any, services: Services, aid: str, teams: list[str]
) -> tuple[int, list[Any]]:
    """All teams' locks and member counts at one instant of Redis (read_seats)."""
    pairs = [(aid, tid) for tid in teams]
    return await read_seats(redis, services.keys, services.clock.shift_ms, pairs)


def check_seat_snapshot(now_ms: int, replies: list[Any], teams: list[str]) -> None:
    """SPEC §4 (1, 2) in one seat_snapshot: no open team over-filled by members and unexpired
    locks, a formed team exactly full, nobody holding two unexpired locks."""
    holders: Counter[str] = Counter()
    for index, tid in enumerate(teams):
        locks, (members, size, status, ttl) = replies[2 * index], replies[2 * index + 1]
        live = [user for user, score in locks if score + int(ttl) > now_ms]
        holders.update(live)
        if status == "open":
            assert int(members) + len(live) <= int(size), (tid, members, live)
        else:
            assert status == "formed" and int(members) == int(size) and not live, (
                tid,
                status,
                members,
            )
    doubled = [user for user, count in holders.items() if count > 1]
    assert not doubled, f"users holding two locks at one instant: {doubled}"


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
