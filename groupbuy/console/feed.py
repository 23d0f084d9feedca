"""The events page's reads: one page of the feed (GET /v1/events' logic), filtered by type
and by activity, team or packet id within that page, and where the tail starts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select

from groupbuy.api.endpoints import is_id
from groupbuy.storage.db import Database
from groupbuy.storage.events import EventRow, read_feed

PAGE = 200  # feed rows read per page or live update, whatever the filter keeps
_TYPE = re.compile(r"[a-z_]{1,32}(\.[a-z_]{1,32}){0,2}")
FILTERS = ("type", "activity_id", "team_id", "packet_id")


@dataclass(frozen=True)
class FeedFilter:
    """What an operator asked to see; empty fields match everything."""

    type: str = ""
    activity_id: str = ""
    team_id: str = ""
    packet_id: str = ""

    @classmethod
    def of(cls, query: Any) -> FeedFilter:
        """From a query string; values that are no type or id are dropped (and said so by
        `rejected`)."""
        values = {name: str(query.get(name) or "").strip() for name in FILTERS}
        kept = {
            name: value
            for name, value in values.items()
            if value and (_TYPE.fullmatch(value) if name == "type" else is_id(value))
        }
        return cls(**kept)

    def keeps(self, event: dict[str, Any]) -> bool:
        """True when the event passes every filter given."""
        data = event.get("data") or {}
        if self.type and event.get("type") != self.type:
            return False
        return all(
            not wanted or data.get(name) == wanted
            for name, wanted in (
                ("activity_id", self.activity_id),
                ("team_id", self.team_id),
                ("packet_id", self.packet_id),
            )
        )

    def query(self) -> dict[str, str]:
        """The filters given, for links that keep them."""
        return {name: getattr(self, name) for name in FILTERS if getattr(self, name)}


async def newest_id(database: Database) -> int:
    """The id of the newest event in the feed (0 when empty): one index probe."""
    async with database.sessions() as session:
        return int(await session.scalar(select(func.max(EventRow.position))) or 0)


async def read_page(database: Database, after: int, wanted: FeedFilter) -> dict[str, Any]:
    """One page of the feed after `after`, kept by the filter: `{"events", "next_after",
    "scanned"}` (`next_after` goes past every event read, kept or not)."""
    page = await read_feed(database, after, PAGE)
    events = [event for event in page["events"] if wanted.keeps(event)]
    return {"events": events, "next_after": page["next_after"], "scanned": len(page["events"])}
