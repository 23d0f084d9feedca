"""Every string the team scripts, this engine and SQL must agree on, built and parsed here.

- a member in a team's members hash: ``seq|joined_at_ms|order_id`` (order '' when none);
- a user's current lock: ``team_id|locked_at_ms|expires_at_ms``;
- the members of a team.formed / team.failed record: ``user|order,user|order`` in
  joining order;
- the dedup keys of team events: ``<type>:<activity_id>:<team_id>[:<user_id>[:<ms>]]``.

Ids match ``[A-Za-z0-9_-]{1,64}``, so neither '|', ',' nor ':' can occur inside one.
The scripts in lua/ write the first three; tests/lua/test_codecs.py checks that this
module reads what they write.
"""

from __future__ import annotations

from typing import NamedTuple


class Member(NamedTuple):
    """One member of a team as its members hash holds it."""

    seq: int
    joined_at_ms: int
    order_id: str | None


class UserLock(NamedTuple):
    """A user's current lock in an activity, as the user's lock key holds it."""

    team_id: str
    locked_at_ms: int
    expires_at_ms: int


class TeamEventKey(NamedTuple):
    """What a team event's dedup key names."""

    type: str
    activity_id: str
    team_id: str


def member_value(seq: int, joined_at_ms: int, order_id: str | None) -> str:
    """`seq|joined_at_ms|order_id`, as team_open and team_confirm write it."""
    return f"{seq}|{joined_at_ms}|{order_id or ''}"


def parse_member(value: str) -> Member:
    """A members-hash value; ValueError when it is not `seq|joined_at_ms|order_id`."""
    seq, joined_at_ms, order_id = value.split("|", 2)
    return Member(int(seq), int(joined_at_ms), order_id or None)


def user_lock_value(team_id: str, locked_at_ms: int, expires_at_ms: int) -> str:
    """`team_id|locked_at_ms|expires_at_ms`, as team_lock writes it."""
    return f"{team_id}|{locked_at_ms}|{expires_at_ms}"


def parse_user_lock(value: str) -> UserLock:
    """A user's lock value; ValueError when malformed."""
    team_id, locked_at_ms, expires_at_ms = value.split("|")
    return UserLock(team_id, int(locked_at_ms), int(expires_at_ms))


def member_list(members: list[tuple[str, str | None]]) -> str:
    """`user|order,user|order` of (user, order) pairs in joining order."""
    return ",".join(f"{user}|{order or ''}" for user, order in members)


def parse_member_list(encoded: str) -> list[tuple[str, str | None]]:
    """(user, order or None) pairs of a team record's `members` field, in joining order."""
    pairs = []
    for item in filter(None, encoded.split(",")):
        user_id, _, order_id = item.partition("|")
        pairs.append((user_id, order_id or None))
    return pairs


def team_event_key(kind: str, activity_id: str, team_id: str, *more: str | int) -> str:
    """The dedup key of a team event: its type, the team, then what else makes it one fact
    (the user who joined; the user and lock time of an expired lock)."""
    return ":".join([kind, activity_id, team_id, *(str(part) for part in more)])


def parse_team_event_key(key: str) -> TeamEventKey | None:
    """The team a team event's dedup key names, or None for another engine's key."""
    parts = key.split(":")
    if len(parts) < 3 or not (parts[0].startswith("team.") or parts[0] == "lock.expired"):
        return None
    return TeamEventKey(parts[0], parts[1], parts[2])
