"""Checks of the values a page or a form is given: ids, feed positions, cursors."""

from __future__ import annotations

import re
from typing import get_args

from groupbuy_client.wire import ID_PATTERN, PacketStatus

from groupbuy import errors
from groupbuy.api.endpoints import is_id
from groupbuy.locks.codec import parse_page_cursor

# Every pattern here is matched against the whole value (fullmatch): `$` alone would let a
# trailing newline through.
_DIGITS = re.compile(r"[0-9]{1,18}")


def an_id(value: object, name: str) -> str:
    """`value` when it is an id (SPEC §2, the API's rule), else 422 naming the field."""
    if isinstance(value, str) and is_id(value):
        return value
    raise errors.InvalidRequest(f"{name} must match {ID_PATTERN}")


def position(value: object, name: str) -> int | None:
    """A feed position or page cursor of digits, None when absent, else 422."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    raise errors.InvalidRequest(f"{name} must be a whole number")


def id_cursor(value: object, name: str) -> str | None:
    """A cursor that is the last id of the page before, None when absent, else 422."""
    if value in (None, ""):
        return None
    return an_id(value, name)


_DELIVERY_CURSOR = re.compile(r"[0-9]{1,18}\.[0-9]{1,18}")
DELIVERY_STATUSES = ("pending", "delivered", "failed")


def delivery_cursor(value: object) -> str | None:
    """A deliveries page cursor (`<ended_ms>.<id>`), None when absent, else 422."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and _DELIVERY_CURSOR.fullmatch(value):
        return value
    raise errors.InvalidRequest("cursor must look like <ms>.<id>")


def delivery_status(value: object) -> str | None:
    """A deliveries filter: pending, delivered or failed; None when absent, else 422."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and value in DELIVERY_STATUSES:
        return value
    raise errors.InvalidRequest(f"status must be one of {', '.join(DELIVERY_STATUSES)}")


ACTIVITY_STATUSES = ("open", "closed")
PACKET_STATUSES: tuple[str, ...] = get_args(PacketStatus)
TEAM_STATUSES = ("open", "full", "formed", "failed")  # full: open, no seat free (members+locks)
LIVE_TEAM_STATUSES = ("open", "full")  # listed from Redis's index of open teams, not SQL
_PACKET_CURSOR = re.compile(r"[0-9]{1,13}\.[A-Za-z0-9_-]{1,64}")
_GRABS_CURSOR = re.compile(r"[0-9]{1,6}")  # a grab's position, as GET .../grabs takes it
_MAX_CURSOR_MS = 253_402_300_799_999  # the last ms of year 9999: SQL times stop there


def one_of(value: object, allowed: tuple[str, ...], name: str) -> str | None:
    """`value` when it is one of `allowed`, None when absent, else 422 naming them."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and value in allowed:
        return value
    raise errors.InvalidRequest(f"{name} must be one of {', '.join(allowed)}")


def page_cursor(value: object, dated: bool = True) -> str | None:
    """A cursor a page of activities or teams answered, None when absent, else 422. A
    `dated` one (a newest-first SQL page) carries a time SQL can hold."""
    if value in (None, ""):
        return None
    if isinstance(value, str):
        try:
            score = parse_page_cursor(value).score
            if not dated or 0 <= score <= _MAX_CURSOR_MS:
                return value
        except ValueError:
            pass
    raise errors.InvalidRequest("cursor is not a cursor this list answered")


def packet_cursor(value: object) -> str | None:
    """A packets page cursor (`<created_ms>.<packet_id>`), None when absent, else 422."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and _PACKET_CURSOR.fullmatch(value):
        return value
    raise errors.InvalidRequest("cursor must look like <ms>.<packet id>")


def grabs_cursor(value: object) -> str | None:
    """A packet's grabs page cursor (a grab's position), None when absent, else 422."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and _GRABS_CURSOR.fullmatch(value):
        return value
    raise errors.InvalidRequest("cursor must be a grab's position (digits)")
