"""Timestamps: milliseconds since the epoch (Redis's clock) to ISO-8601 UTC with ms."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import overload


@overload
def iso_ms(ms: int) -> str: ...
@overload
def iso_ms(ms: None) -> None: ...
@overload
def iso_ms(ms: int | None) -> str | None: ...
def iso_ms(ms: int | None) -> str | None:
    """`1763746971123` -> `2025-11-21T17:42:51.123Z`; None stays None."""
    if ms is None:
        return None
    seconds, millis = divmod(ms, 1000)
    return f"{_iso_second(seconds)}{millis:03d}Z"


@lru_cache(maxsize=4096)
def _iso_second(seconds: int) -> str:
    # Answers given in the same second share this part; strftime was a hot spot under load.
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")


def to_ms(moment: datetime) -> int:
    """A datetime (naive means UTC, as SQLite returns it) to epoch milliseconds."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    """Epoch milliseconds to an aware UTC datetime for SQL columns."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
