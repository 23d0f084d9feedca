"""Seats as Redis holds them: an instant of every team's seats (checked against SPEC §4), and
the open-seat index of an activity, read as it is and recomputed from the teams' own keys."""

from __future__ import annotations

from collections import Counter
from typing import Any

from groupbuy.locks.codec import seat_score
from groupbuy.services import Services
from groupbuy.storage.keys import Keys
from groupbuy.testing.seats import read_seats


async def seat_snapshot(
    redis: Any, services: Services, aid: str, teams: list[str]
) -> tuple[int, list[Any]]:
    """All teams' locks and member counts at one instant of Redis (groupbuy.testing.seats)."""
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
