"""The team scripts' outbox records: each type's fields, its event's dedup key, and how a
batch of them becomes SQL rows and events (idempotently).

To add an event type: the script that changes state emits it (`emit({...})` in lua/), and
this module gains its record TypedDict (in TEAM_RECORDS), its key parts
(_EVENT_EXTRA_PARTS) and its branch in `_event`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, cast

from groupbuy_client.wire import iso_ms
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.locks import codec
from groupbuy.locks.event_keys import (
    EVENT_TYPES,
    KEY,
    TeamEventKey,
    parse_event_key,
    team_event_key,
)
from groupbuy.locks.waitlist_records import (
    WAITLIST_RECORDS,
    WaitlistRecord,
    event_key_parts,
    waitlist_event,
)
from groupbuy.metrics import WAITLIST_ENTRIES
from groupbuy.storage.bulk import Moments, dialect_of
from groupbuy.storage.events import Event
from groupbuy.storage.steps import Statement, Steps, inserting, run_on_session
from groupbuy.storage.typedrecords import parse_record

__all__ = ["EVENT_TYPES", "KEY", "TeamEventKey", "parse_event_key", "team_event_key"]

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


class _Offered(_Versioned, total=False):
    offered: str  # '1' when the lock was the waitlist's offer


class MemberJoined(_Offered):
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


class _Failed(_Versioned, total=False):
    reason: str  # deadline | dissolved | abandoned (records from before reasons: deadline)


class TeamFailed(_Failed):
    """lua/_team_lib.lua (fail_team): a team that failed: its deadline passed before it was
    full, an admin dissolved it, or its last member left."""

    type: Literal["team.failed"]
    at_ms: str
    activity_id: str
    team_id: str
    members: str  # a member list (`member_list`): the members to refund


class LockExpired(_Versioned):
    """lua/_team_lib.lua, lua/team_lock.lua: a seat lock whose time ran out."""

    type: Literal["lock.expired"]
    at_ms: str
    activity_id: str
    team_id: str
    user_id: str
    locked_at_ms: str


class LockExtended(_Versioned):
    """lua/team_extend.lua: a seat lock that now expires later."""

    type: Literal["lock.extended"]
    at_ms: str
    activity_id: str
    team_id: str
    user_id: str
    locked_at_ms: str
    expires_at_ms: str


class _Leave(_Versioned):
    at_ms: str
    activity_id: str
    team_id: str
    user_id: str
    order_id: str  # '' when the member had no order
    reason: str  # the shop's reason ('' for none)


class MemberLeft(_Leave):
    """lua/team_leave.lua: a member the shop refunded left an open team (seat freed)."""

    type: Literal["team.member_left"]


class MemberRefunded(_Leave):
    """lua/team_leave.lua: a member of a formed team the shop refunded (still listed)."""

    type: Literal["team.member_refunded"]


class LeaderChanged(_Versioned):
    """lua/team_leave.lua: the leader left; the earliest remaining member leads."""

    type: Literal["team.leader_changed"]
    at_ms: str
    activity_id: str
    team_id: str
    leader_id: str
    previous_leader_id: str


_SeatRecord = TeamOpened | MemberJoined | TeamFormed | TeamFailed | LockExpired | LockExtended
TeamRecord = _SeatRecord | MemberLeft | MemberRefunded | LeaderChanged | WaitlistRecord
TEAM_RECORDS: dict[str, type[TeamRecord]] = {
    **WAITLIST_RECORDS,
    "team.opened": TeamOpened,
    "team.member_joined": MemberJoined,
    "team.formed": TeamFormed,
    "team.failed": TeamFailed,
    "lock.expired": LockExpired,
    "lock.extended": LockExtended,
    "team.member_left": MemberLeft,
    "team.member_refunded": MemberRefunded,
    "team.leader_changed": LeaderChanged,
}
"""Every team record type by its `type` field."""


def parse_team_record(fields: Mapping[str, str]) -> TeamRecord:
    """An outbox entry's fields as the team record its `type` names: ValueError for an
    unknown type, KeyError for a missing field."""
    return parse_record("team", TEAM_RECORDS, fields)


def _members(encoded: str) -> list[dict[str, Any]]:
    return [m._asdict() for m in codec.parse_member_list(encoded)]


def _member_row(f: TeamOpened | MemberJoined, user_id: str, seq: int, at: Any) -> tuple[Any, ...]:
    """A new member's row (_NEW_MEMBERS' values)."""
    return (f["activity_id"], f["team_id"], user_id, f.get("order_id") or None, seq, at)


_NEW_TEAMS = (
    "INSERT INTO teams (activity_id, team_id, leader_id, status, size, created_at, "
    "deadline_at, redis_cleared, version)"
)
_NEW_MEMBERS = "INSERT INTO team_members (activity_id, team_id, user_id, order_id, seq, joined_at)"
_ONCE = " ON CONFLICT DO NOTHING"
# A team's version only goes up: a record applied late (a retried batch, a dead letter
# replayed) leaves the newer version in place.
_RAISE_VERSION = (
    "UPDATE teams SET version = ? WHERE activity_id = ? AND team_id = ? AND version < ?"
)


@dataclass(frozen=True)
class TeamBatch:
    """A batch of team records as SQL takes it, built before the transaction: the new teams
    and members, the endings' statements in the records' order, the versions to raise, and
    the events in order."""

    teams: list[tuple[Any, ...]]
    members: list[tuple[Any, ...]]
    endings: list[Statement]
    versions: list[tuple[int, str, str, int]]
    events: list[Event]

    @classmethod
    def of(cls, records: list[TeamRecord], moments: Moments) -> TeamBatch:
        """The rows and events of `records`."""
        teams: list[list[Any]] = []
        members: list[tuple[Any, ...]] = []
        endings: list[Statement] = []
        events = [_versioned(_project(f, teams, members, endings, moments), f) for f in records]
        versions = _team_versions(records)
        for team in teams:  # a team opened in this batch goes in at its version after it
            team.append(versions.pop((team[0], team[1]), 0))
        raised = [(v, aid, tid, v) for (aid, tid), v in versions.items()]
        return cls([tuple(t) for t in teams], members, endings, raised, events)

    def steps(self) -> Steps[None]:
        """The batch's rows, as steps (groupbuy/storage/steps.py).

        New teams and members go in with a statement each, whatever the batch size; the
        rare endings, leaves, refunds and leader changes update their rows after that, in
        order, and one statement a team raises the version of the teams the other records
        changed. Rows applied before are skipped and a version never goes down, so a batch
        applied twice changes nothing."""
        yield from inserting(_NEW_TEAMS, self.teams, _ONCE)
        yield from inserting(_NEW_MEMBERS, self.members, _ONCE)
        # Not `yield from` a list: the runner sends each statement's rows back, and a
        # list's iterator takes no send().
        for ending in self.endings:  # noqa: UP028
            yield ending
        if self.versions:
            yield Statement(_RAISE_VERSION, self.versions, many=True)


async def project_team_records(session: AsyncSession, records: list[TeamRecord]) -> list[Event]:
    """Apply a batch of team-script outbox entries to SQL, in the session's transaction,
    and return their events in order (`TeamBatch`)."""
    batch = TeamBatch.of(records, Moments(await dialect_of(session)))
    await run_on_session(session, batch.steps())
    return batch.events


def _team_versions(records: list[TeamRecord]) -> dict[tuple[str, str], int]:
    """(activity_id, team_id) -> the highest version the batch's records of the team carry
    (records written before teams had versions carry none)."""
    versions: dict[tuple[str, str], int] = {}
    for f in records:
        version = _version_of(f)
        if version is not None:
            team = (f["activity_id"], f["team_id"])
            versions[team] = max(versions.get(team, 0), version)
    return versions


def _version_of(f: TeamRecord) -> int | None:
    """The team's version after the record's change; None for a record without one (one
    from before versions, or a waitlist entry that ended without touching a team)."""
    version = cast(Mapping[str, str], f).get("version")
    return None if version is None else int(version)


def _versioned(event: Event, f: TeamRecord) -> Event:
    """The event with the team's version after the change in its data (records written
    before teams had versions carry none)."""
    version = _version_of(f)
    if version is not None:
        event.data["version"] = version
    return event


def _team_update(f: TeamRecord, changes: str, *values: Any) -> Statement:
    """An UPDATE of the record's team row: `changes` is its SET clause."""
    return Statement(
        f"UPDATE teams SET {changes} WHERE activity_id = ? AND team_id = ?",
        (*values, f["activity_id"], f["team_id"]),
    )


def _member_update(f: MemberLeft | MemberRefunded, changes: str, *values: Any) -> Statement:
    """An UPDATE of the record's member row: `changes` is its SET clause."""
    return Statement(
        f"UPDATE team_members SET {changes} WHERE activity_id = ? AND team_id = ? AND user_id = ?",
        (*values, f["activity_id"], f["team_id"], f["user_id"]),
    )


def _project(
    f: TeamRecord,
    teams: list[list[Any]],
    members: list[tuple[Any, ...]],
    endings: list[Statement],
    moments: Moments,
) -> Event:
    """The event of one record; the rows it stands for are added to the lists."""
    kind, aid, tid, at_ms = f["type"], f["activity_id"], f["team_id"], int(f["at_ms"])
    base = {"activity_id": aid, "team_id": tid}
    if f["type"] == "team.opened":
        at = moments(f["at_ms"])
        deadline = moments(f["deadline_ms"])
        teams.append([aid, tid, f["leader_id"], "open", int(f["size"]), at, deadline, False])
        members.append(_member_row(f, f["leader_id"], 1, at))
        data = {**base, "leader_id": f["leader_id"], "order_id": f["order_id"] or None}
        return Event(kind, at_ms, team_event_key(kind, aid, tid), data)
    if (
        f["type"] == "lock.offered"
        or f["type"] == "waitlist.dropped"
        or f["type"] == "waitlist.expired"
    ):
        return waitlist_event(f, team_event_key(kind, aid, *event_key_parts(f)))
    if f["type"] == "team.member_joined":
        if f.get("offered") == "1":
            WAITLIST_ENTRIES.labels(outcome="taken").inc()
        members.append(_member_row(f, f["user_id"], int(f["seq"]), moments(f["at_ms"])))
        data = {**base, "user_id": f["user_id"], "order_id": f["order_id"] or None}
        return Event(kind, at_ms, team_event_key(kind, aid, tid, f["user_id"]), data)
    if f["type"] == "team.formed" or f["type"] == "team.failed":
        members_data: dict[str, Any] = {**base, "members": _members(f["members"])}
        at = moments(f["at_ms"])
        if f["type"] == "team.formed":
            endings.append(_team_update(f, "status = 'formed', formed_at = ?", at))
            members_data["virtual_seats"] = int(f.get("virtual_seats", 0))
        else:
            why = f.get("reason", "deadline")
            failed = "status = 'failed', failed_at = ?, failed_reason = ?"
            endings.append(_team_update(f, failed, at, why))
            members_data["reason"] = why
        return Event(kind, at_ms, team_event_key(kind, aid, tid), members_data)
    if f["type"] == "team.member_left" or f["type"] == "team.member_refunded":
        reason = f["reason"] or None
        when = "left_at" if f["type"] == "team.member_left" else "refunded_at"
        change = f"{when} = ?, leave_reason = ?"
        endings.append(_member_update(f, change, moments(f["at_ms"]), reason))
        data = {
            **base,
            "user_id": f["user_id"],
            "order_id": f["order_id"] or None,
            "reason": reason,
        }
        return Event(kind, at_ms, team_event_key(kind, aid, tid, f["user_id"]), data)
    if f["type"] == "team.leader_changed":
        endings.append(_team_update(f, "leader_id = ?", f["leader_id"]))
        data = {
            **base,
            "leader_id": f["leader_id"],
            "previous_leader_id": f["previous_leader_id"],
        }
        return Event(kind, at_ms, team_event_key(kind, aid, tid, f["leader_id"]), data)
    if f["type"] == "lock.expired":
        locked_at_ms = int(f["locked_at_ms"])
        data = {
            **base,
            "user_id": f["user_id"],
            "locked_at": iso_ms(locked_at_ms),
            "expired_at": iso_ms(at_ms),
        }
        key = team_event_key(kind, aid, tid, f["user_id"], locked_at_ms)
        return Event(kind, at_ms, key, data)
    if f["type"] == "lock.extended":
        data = {
            **base,
            "user_id": f["user_id"],
            "locked_at": iso_ms(int(f["locked_at_ms"])),
            "expires_at": iso_ms(int(f["expires_at_ms"])),
        }
        key = team_event_key(kind, aid, tid, f["user_id"], int(f["version"]))
        return Event(kind, at_ms, key, data)
    raise ValueError(f"unknown team record type {kind!r}")
