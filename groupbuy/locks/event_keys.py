"""The dedup keys of the team engine's events: ``<type>:<aid>:<tid>[:<user>[:<number>]]``,
one per fact (groupbuy.locks.records re-exports them)."""

from __future__ import annotations

from typing import NamedTuple

from groupbuy.locks.codec import int_field

KEY = ":"  # between the parts of an event key

# Event types of the team engine, and how many parts follow "<type>:<aid>:<tid>".
_EVENT_EXTRA_PARTS = {
    "team.opened": 0,
    "team.member_joined": 1,  # user_id
    "team.formed": 0,
    "team.failed": 0,
    "lock.expired": 2,  # user_id, locked_at_ms
    "lock.extended": 2,  # user_id, the team's version after it (one key per extension)
    "team.member_left": 1,  # user_id (who left never joins the team again)
    "team.leader_changed": 1,  # user_id: the new leader (a leader who leaves never returns)
    "team.member_refunded": 1,  # user_id
    "lock.offered": 2,  # user_id, locked_at_ms
    "waitlist.dropped": 2,  # user_id, the entry's seq (team: '*' for any team)
    "waitlist.expired": 2,  # user_id, the entry's seq
}
EVENT_TYPES = tuple(_EVENT_EXTRA_PARTS)


class TeamEventKey(NamedTuple):
    """The identity of a team event: ``<type>:<aid>:<tid>[:<user>[:<locked_at_ms>]]``."""

    type: str
    activity_id: str
    team_id: str
    user_id: str | None = None  # team.member_*, team.leader_changed, lock.expired
    locked_at_ms: int | None = None  # lock.expired (lock.extended: the version after it)


def team_event_key(
    event_type: str,
    activity_id: str,
    team_id: str,
    user_id: str | None = None,
    locked_at_ms: int | None = None,
) -> str:
    """The dedup key an event of the team engine is recorded under (one per fact)."""
    extra = _EVENT_EXTRA_PARTS.get(event_type)
    if extra is None:
        raise ValueError(f"{event_type!r} is not an event of the team engine")
    tail = [user_id, None if locked_at_ms is None else str(locked_at_ms)]
    if None in tail[:extra] or any(part is not None for part in tail[extra:]):
        raise ValueError(f"a {event_type} key has {extra} part(s) after the team id")
    return KEY.join([event_type, activity_id, team_id, *(str(p) for p in tail[:extra])])


def parse_event_key(key: str) -> TeamEventKey | None:
    """A team event's dedup key, or None for an event of another engine."""
    parts = key.split(KEY)
    extra = _EVENT_EXTRA_PARTS.get(parts[0])
    if extra is None:
        return None
    if len(parts) != 3 + extra or not all(parts):
        raise ValueError(f"event key {key!r} does not have {3 + extra} ':'-separated parts")
    event_type, activity_id, team_id, *tail = parts
    user_id = tail[0] if extra >= 1 else None
    locked_at_ms = int_field(tail[1], "event key", key) if extra == 2 else None
    return TeamEventKey(event_type, activity_id, team_id, user_id, locked_at_ms)
