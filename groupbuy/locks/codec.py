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
from collections.abc import Iterable
from typing import NamedTuple

FIELD = "|"  # between the fields of a Redis value
ITEM = ","  # between the members of a member list


def _fields(value: str, count: int, what: str) -> list[str]:
    parts = value.split(FIELD)
    if len(parts) != count:
        raise ValueError(f"{what} {value!r} does not have {count} '{FIELD}'-separated fields")
    return parts


def int_field(text: str, what: str, value: str) -> int:
    """A non-negative integer field of `value` (a `what`), or ValueError."""
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
    return Member(
        int_field(seq, what, value), int_field(joined_at_ms, what, value), order_id or None
    )


LEFT_FIELD = "left:"
"""A team hash field remembering a member's leave (lua/team_leave.lua) is this, then the
user id."""


class Leave(NamedTuple):
    """A member's leave as the team hash remembers it: ``kind|at_ms|order_id`` (kind: `left`
    out of an open team, `refunded` in a formed one)."""

    kind: str
    at_ms: int
    order_id: str | None  # '' when the member had no order


def leave_value(kind: str, at_ms: int, order_id: str | None) -> str:
    """The left:<user> value team_leave writes."""
    return FIELD.join((kind, str(at_ms), order_id or ""))


def parse_leave(value: str) -> Leave:
    """A left:<user> value as team_leave wrote it."""
    what = "leave value"
    kind, at_ms, order_id = _fields(value, 3, what)
    if kind not in ("left", "refunded"):
        raise ValueError(f"{what} {value!r} has an unknown kind {kind!r}")
    return Leave(kind, int_field(at_ms, what, value), order_id or None)


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
        int_field(locked_at_ms, what, value),
        int_field(expires_at_ms, what, value),
        int_field(deadline_ms, what, value),
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
