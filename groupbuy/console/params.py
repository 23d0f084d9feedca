"""Checks of the values a page or a form is given: ids, feed positions, cursors."""

from __future__ import annotations

import re

from groupbuy import errors

ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DIGITS = re.compile(r"^[0-9]{1,18}$")


def an_id(value: object, name: str) -> str:
    """`value` when it is an id (SPEC §2), else 422 naming the field."""
    if isinstance(value, str) and ID.match(value):
        return value
    raise errors.InvalidRequest(f"{name} must match {ID.pattern}")


def position(value: object, name: str) -> int | None:
    """A feed position or page cursor of digits, None when absent, else 422."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and _DIGITS.match(value):
        return int(value)
    raise errors.InvalidRequest(f"{name} must be a whole number")


def id_cursor(value: object, name: str) -> str | None:
    """A cursor that is the last id of the page before, None when absent, else 422."""
    if value in (None, ""):
        return None
    return an_id(value, name)


_DELIVERY_CURSOR = re.compile(r"^[0-9]{1,18}\.[0-9]{1,18}$")
DELIVERY_STATUSES = ("pending", "delivered", "failed")


def delivery_cursor(value: object) -> str | None:
    """A deliveries page cursor (`<ended_ms>.<id>`), None when absent, else 422."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and _DELIVERY_CURSOR.match(value):
        return value
    raise errors.InvalidRequest("cursor must look like <ms>.<id>")


def delivery_status(value: object) -> str | None:
    """A deliveries filter: pending, delivered or failed; None when absent, else 422."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and value in DELIVERY_STATUSES:
        return value
    raise errors.InvalidRequest(f"status must be one of {', '.join(DELIVERY_STATUSES)}")
