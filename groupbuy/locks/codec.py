"""Every string the team scripts, Python and SQL share, built and parsed in one place.

The scripts (lua/_team_lib.lua and the team_* scripts) write the Redis values and the
outbox records (`emit({...})`); these functions and types read them back, and build the
same strings where Python or a test needs one.
Ids match ``^[A-Za-z0-9_-]{1,64}$`` (SPEC §2), so neither '|', ',' nor ':' can occur
inside a field; a value that does not split into its fields is a bug and raises ValueError.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from typing import Literal, NamedTuple, TypedDict

from groupbuy.storage.typedrecords import parse_record

FIELD = "|"  # between the fields of a Redis value
ITEM = ","  # between the members of a member list
KEY = ":"  # between the parts of an event key

# Event types of the team engine, and how many parts follow "<type>:<aid>:<tid>".
_EVENT_EXTRA_PARTS = {
    "team.opened": 0,
    "team.member_joined": 1,  # user_id
    "team.formed": 0,
    "team.failed": 0,
    "lock.expired": 2,  # user_id, locked_at_ms
}
EVENT_TYPES = tuple(_EVENT_EXTRA_PARTS)


def _fields(value: str, count: int, what: str) -> list[str]:
    parts = value.split(FIELD)
    if len(parts) != count:
        raise ValueError(f"{what} {value!r} does not have {count} '{FIELD}'-separated fields")
    return parts


def _int(text: str, what: str, value: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{what} {value!r} has a non-integer field {text!r}")
    return int(text)


class Member(NamedTuple):
    """A member's value in the team's members hash: ``seq|joined_at_ms|order_id``."""

    seq: int
    joined_at_ms: int
    order_id: str | None  # stored as '' when the member has no order


def member_value(seq: int, joined_at_ms: int, order_id: str | None) -> str:
    """The members-hash value the scripts write for one member."""
    return FIELD.join((str(seq), str(joined_at_ms), order_id or ""))


def parse_member(value: str) -> Member:
    """A members-hash value as the scripts wrote it."""
    what = "member value"
    seq, joined_at_ms, order_id = _fields(value, 3, what)
    return Member(_int(seq, what, value), _int(joined_at_ms, what, value), order_id or None)


class CurrentLock(NamedTuple):
    """A user's current-lock value in an activity:
    ``team_id|locked_at_ms|expires_at_ms|team_deadline_ms``.

    The team's deadline is in the value so the value alone tells whether the lock is live
    (a lock ends at its expiry, or with its team at the deadline; the other endings delete
    or overwrite the key): user_lock_read answers from it in one call.
    """

    team_id: str
    locked_at_ms: int
    expires_at_ms: int
    deadline_ms: int


def current_lock_value(
    team_id: str, locked_at_ms: int, expires_at_ms: int, deadline_ms: int
) -> str:
    """The current-lock value team_lock writes."""
    return FIELD.join((team_id, str(locked_at_ms), str(expires_at_ms), str(deadline_ms)))


def parse_current_lock(value: str) -> CurrentLock:
    """A current-lock value as team_lock wrote it."""
    what = "current lock"
    team_id, locked_at_ms, expires_at_ms, deadline_ms = _fields(value, 4, what)
    if not team_id:
        raise ValueError(f"current lock {value!r} names no team")
    return CurrentLock(
        team_id,
        _int(locked_at_ms, what, value),
        _int(expires_at_ms, what, value),
        _int(deadline_ms, what, value),
    )


SEAT_WEIGHT = 2**42
"""What one taken seat weighs in a seat score: more than any created_ms (lua/_team_lib.lua)."""


def seat_score(taken: int, created_ms: int) -> int:
    """An open team's score in its activity's open-seat index, as index_seats writes it: the
    more seats taken (members + locks), the lower; then the older, the lower."""
    return created_ms - taken * SEAT_WEIGHT


class PageCursor(NamedTuple):
    """Where a page of open teams ended: the last open-seat index entry looked at."""

    score: int
    team_id: str


_CURSOR_TEXT = re.compile(r"[A-Za-z0-9_-]{1,200}")
_CURSOR_VALUE = re.compile(r"(-?[0-9]{1,16})\|([A-Za-z0-9_-]{1,64})")


def page_cursor(score: int, team_id: str) -> str:
    """The opaque `next_cursor` of a page of open teams: url-safe base64 of
    ``score|team_id``, unpadded."""
    raw = FIELD.join((str(score), team_id)).encode("ascii")
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def parse_page_cursor(text: str) -> PageCursor:
    """A cursor exactly as page_cursor built it; ValueError for anything else."""
    if _CURSOR_TEXT.fullmatch(text):
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
        except (binascii.Error, UnicodeDecodeError):
            raw = ""
        found = _CURSOR_VALUE.fullmatch(raw)
        if found and page_cursor(int(found[1]), found[2]) == text:
            return PageCursor(int(found[1]), found[2])
    raise ValueError("not a cursor this list answered")


class ListedMember(NamedTuple):
    """One entry of the member list in team.formed / team.failed records."""

    user_id: str
    order_id: str | None  # '' in the list when the member has no order


def member_list(members: Iterable[tuple[str, str | None]]) -> str:
    """``u1|o1,u2|``: (user, order) in joining order, as the scripts' member_list() writes it."""
    return ITEM.join(FIELD.join((user_id, order_id or "")) for user_id, order_id in members)


def parse_member_list(encoded: str) -> list[ListedMember]:
    """The members of a team.formed / team.failed record, in joining order."""
    members = []
    for item in encoded.split(ITEM) if encoded else []:
        user_id, order_id = _fields(item, 2, "member list item")
        if not user_id:
            raise ValueError(f"member list {encoded!r} has an item without a user")
        members.append(ListedMember(user_id, order_id or None))
    return members


class TeamEventKey(NamedTuple):
    """The identity of a team event: ``<type>:<aid>:<tid>[:<user>[:<locked_at_ms>]]``."""

    type: str
    activity_id: str
    team_id: str
    user_id: str | None = None  # team.member_joined, lock.expired
    locked_at_ms: int | None = None  # lock.expired


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
    locked_at_ms = _int(tail[1], "event key", key) if extra == 2 else None
    return TeamEventKey(event_type, activity_id, team_id, user_id, locked_at_ms)


# -- outbox records: the fields each `emit({...})` of the team scripts writes -------------


class _Versioned(TypedDict, total=False):
    version: str  # the team's version after the change (records from before versions: none)


class TeamOpened(_Versioned):
    """lua/team_open.lua: a team and its leader, the first member."""

    type: Literal["team.opened"]
    at_ms: str
    activity_id: str
    team_id: str
    leader_id: str
    order_id: str  # '' when the leader has no order
    size: str
    deadline_ms: str


class MemberJoined(_Versioned):
    """lua/team_confirm.lua: a member whose seat lock was confirmed."""

    type: Literal["team.member_joined"]
    at_ms: str
    activity_id: str
    team_id: str
    user_id: str
    order_id: str  # '' when the member has no order
    seq: str


class _Formed(_Versioned, total=False):
    virtual_seats: str  # seats filled virtually at the deadline (a confirm's record: none)


class TeamFormed(_Formed):
    """lua/team_confirm.lua (the last seat) or lua/_team_lib.lua (the deadline): a full team."""

    type: Literal["team.formed"]
    at_ms: str
    activity_id: str
    team_id: str
    members: str  # a member list (`member_list`)


class TeamFailed(_Versioned):
    """lua/_team_lib.lua: a team whose deadline passed before it was full."""

    type: Literal["team.failed"]
    at_ms: str
    activity_id: str
    team_id: str
    members: str  # a member list (`member_list`)


class LockExpired(_Versioned):
    """lua/_team_lib.lua, lua/team_lock.lua: a seat lock whose time ran out."""

    type: Literal["lock.expired"]
    at_ms: str
    activity_id: str
    team_id: str
    user_id: str
    locked_at_ms: str


TeamRecord = TeamOpened | MemberJoined | TeamFormed | TeamFailed | LockExpired
TEAM_RECORDS: dict[str, type[TeamRecord]] = {
    "team.opened": TeamOpened,
    "team.member_joined": MemberJoined,
    "team.formed": TeamFormed,
    "team.failed": TeamFailed,
    "lock.expired": LockExpired,
}
"""Every team record type by its `type` field."""


def parse_team_record(fields: Mapping[str, str]) -> TeamRecord:
    """An outbox entry's fields as the team record its `type` names: ValueError for an
    unknown type, KeyError for a missing field."""
    return parse_record("team", TEAM_RECORDS, fields)
