"""The waitlist's outbox records (lua/_waitlist_lib.lua) and their events: an offer, and an
entry that ended without one (dropped or expired). Only events: the line lives in Redis.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from groupbuy_client.wire import iso_ms

from groupbuy.metrics import WAITLIST_ENTRIES
from groupbuy.storage.events import Event

# An entry for any team has no team: its events' keys carry this in the team's place.
ANY_TEAM = "*"


class _Versioned(TypedDict, total=False):
    version: str  # the team's version after the offer


class LockOffered(_Versioned):
    """lua/_waitlist_lib.lua (offer): the line's head got a seat lock."""

    type: Literal["lock.offered"]
    at_ms: str
    activity_id: str
    team_id: str
    user_id: str
    locked_at_ms: str
    expires_at_ms: str
    queued_ms: str
    seq: str  # the entry's number in the activity's lines


class _Ended(TypedDict):
    at_ms: str
    activity_id: str
    team_id: str  # '' for an entry waiting for any team
    user_id: str
    queued_ms: str
    seq: str  # the entry's number in the activity's lines (one per entry)


class WaitlistDropped(_Ended):
    """lua/_waitlist_lib.lua (end_entry): an entry whose user may no longer take a seat."""

    type: Literal["waitlist.dropped"]
    reason: str  # blocked | member | left | limit | locked | team_formed | team_failed


class WaitlistExpired(_Ended):
    """lua/_waitlist_lib.lua (end_entry): an entry whose time ran out."""

    type: Literal["waitlist.expired"]


WaitlistRecord = LockOffered | WaitlistDropped | WaitlistExpired
WAITLIST_RECORDS: dict[str, type[WaitlistRecord]] = {
    "lock.offered": LockOffered,
    "waitlist.dropped": WaitlistDropped,
    "waitlist.expired": WaitlistExpired,
}


def waitlist_event(f: WaitlistRecord, key: str) -> Event:
    """The event of a waitlist record (`key`: its dedup key); counts it in the metrics."""
    data: dict[str, Any] = {
        "activity_id": f["activity_id"],
        "team_id": f["team_id"] or None,
        "user_id": f["user_id"],
        "queued_at": iso_ms(int(f["queued_ms"])),
    }
    if f["type"] == "lock.offered":
        data["locked_at"] = iso_ms(int(f["locked_at_ms"]))
        data["expires_at"] = iso_ms(int(f["expires_at_ms"]))
        WAITLIST_ENTRIES.labels(outcome="offered").inc()
    elif f["type"] == "waitlist.dropped":
        data["reason"] = f["reason"]
        WAITLIST_ENTRIES.labels(outcome="dropped").inc()
    else:
        WAITLIST_ENTRIES.labels(outcome="expired").inc()
    return Event(f["type"], int(f["at_ms"]), key, data)


def event_key_parts(f: WaitlistRecord) -> tuple[str, str, int]:
    """(team part, user, number) of the record's event key: an offer is one per lock (its
    locked_at), an ended entry one per entry (its seq)."""
    if f["type"] == "lock.offered":
        return f["team_id"], f["user_id"], int(f["locked_at_ms"])
    return f["team_id"] or ANY_TEAM, f["user_id"], int(f["seq"])
