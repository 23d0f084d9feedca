"""The team scripts' outbox records: each type's fields, its event's dedup key, and how a
batch of them becomes SQL rows and events (idempotently).

To add an event type: the script that changes state emits it (`emit({...})` in lua/), and
this module gains its record TypedDict (in TEAM_RECORDS), its key parts
(_EVENT_EXTRA_PARTS) and its branch in `_event`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict, cast

from groupbuy_client.wire import from_ms, iso_ms
from sqlalchemy import Table, bindparam, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.locks import codec
from groupbuy.locks.event_keys import (
    EVENT_TYPES,
    KEY,
    TeamEventKey,
    parse_event_key,
    team_event_key,
)
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.locks.waitlist_records import (
    WAITLIST_RECORDS,
    WaitlistRecord,
    event_key_parts,
    waitlist_event,
)
from groupbuy.metrics import WAITLIST_ENTRIES
from groupbuy.storage.db import dialect_insert
from groupbuy.storage.events import Event
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


def _member_row(f: TeamOpened | MemberJoined, user_id: str, seq: int) -> dict[str, Any]:
    return {
        "activity_id": f["activity_id"],
        "team_id": f["team_id"],
        "user_id": user_id,
        "order_id": f.get("order_id") or None,
        "seq": seq,
        "joined_at": from_ms(int(f["at_ms"])),
    }


async def project_team_records(session: AsyncSession, records: list[TeamRecord]) -> list[Event]:
    """Apply a batch of team-script outbox entries to SQL and return their events in order.

    New teams and members go in with one executemany each, whatever the batch size (a
    flush inside a confirm used to wait on one statement per record); the rare endings,
    leaves, refunds and leader changes update their rows after that, in order, and one
    executemany raises the version of the teams the other records changed. Rows applied
    before are skipped and a version never goes down, so a batch applied twice changes
    nothing.
    """
    teams: list[dict[str, Any]] = []
    members: list[dict[str, Any]] = []
    endings: list[Any] = []  # UPDATE statements, applied in the records' order
    events = [_versioned(_project(f, teams, members, endings), f) for f in records]
    versions = _team_versions(records)
    for team in teams:  # a team opened in this batch goes in at its version after the batch
        team["version"] = versions.pop((team["activity_id"], team["team_id"]), 0)
    if teams:
        await session.execute(
            dialect_insert(session, TeamRow.__table__).on_conflict_do_nothing(), teams
        )
    if members:
        await session.execute(
            dialect_insert(session, MemberRow.__table__).on_conflict_do_nothing(), members
        )
    for statement in endings:
        await session.execute(statement)
    if versions:
        await session.execute(
            _RAISE_VERSION,
            [{"b_aid": aid, "b_tid": tid, "b_version": v} for (aid, tid), v in versions.items()],
        )
    return events


_TEAMS = cast(Table, TeamRow.__table__)
# A team's version only goes up: a record applied late (a retried batch, a dead letter
# replayed) leaves the newer version in place.
_RAISE_VERSION = (
    update(_TEAMS)
    .where(
        _TEAMS.c.activity_id == bindparam("b_aid"),
        _TEAMS.c.team_id == bindparam("b_tid"),
        _TEAMS.c.version < bindparam("b_version"),
    )
    .values(version=bindparam("b_version"))
)


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


def _team_update(f: TeamRecord) -> Any:
    """An UPDATE of the record's team row."""
    return update(TeamRow).where(
        TeamRow.activity_id == f["activity_id"], TeamRow.team_id == f["team_id"]
    )


def _member_update(f: MemberLeft | MemberRefunded) -> Any:
    """An UPDATE of the record's member row."""
    return update(MemberRow).where(
        MemberRow.activity_id == f["activity_id"],
        MemberRow.team_id == f["team_id"],
        MemberRow.user_id == f["user_id"],
    )


def _project(
    f: TeamRecord,
    teams: list[dict[str, Any]],
    members: list[dict[str, Any]],
    endings: list[Any],
) -> Event:
    """The event of one record; the rows it stands for are added to the lists."""
    kind, aid, tid, at_ms = f["type"], f["activity_id"], f["team_id"], int(f["at_ms"])
    base = {"activity_id": aid, "team_id": tid}
    if f["type"] == "team.opened":
        teams.append(
            {
                **base,
                "leader_id": f["leader_id"],
                "status": "open",
                "size": int(f["size"]),
                "created_at": from_ms(at_ms),
                "deadline_at": from_ms(int(f["deadline_ms"])),
            }
        )
        members.append(_member_row(f, f["leader_id"], 1))
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
        members.append(_member_row(f, f["user_id"], int(f["seq"])))
        data = {**base, "user_id": f["user_id"], "order_id": f["order_id"] or None}
        return Event(kind, at_ms, team_event_key(kind, aid, tid, f["user_id"]), data)
    if f["type"] == "team.formed" or f["type"] == "team.failed":
        members_data: dict[str, Any] = {**base, "members": _members(f["members"])}
        at = from_ms(at_ms)
        if f["type"] == "team.formed":
            endings.append(_team_update(f).values(status="formed", formed_at=at))
            members_data["virtual_seats"] = int(f.get("virtual_seats", 0))
        else:
            why = f.get("reason", "deadline")
            endings.append(_team_update(f).values(status="failed", failed_at=at, failed_reason=why))
            members_data["reason"] = why
        return Event(kind, at_ms, team_event_key(kind, aid, tid), members_data)
    if f["type"] == "team.member_left" or f["type"] == "team.member_refunded":
        reason = f["reason"] or None
        if f["type"] == "team.member_left":
            change = {"left_at": from_ms(at_ms), "leave_reason": reason}
        else:
            change = {"refunded_at": from_ms(at_ms), "leave_reason": reason}
        endings.append(_member_update(f).values(**change))
        data = {
            **base,
            "user_id": f["user_id"],
            "order_id": f["order_id"] or None,
            "reason": reason,
        }
        return Event(kind, at_ms, team_event_key(kind, aid, tid, f["user_id"]), data)
    if f["type"] == "team.leader_changed":
        endings.append(_team_update(f).values(leader_id=f["leader_id"]))
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
