"""How the team scripts' outbox entries become SQL rows and events (idempotently)."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, bindparam, update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.locks import codec
from groupbuy.locks.codec import MemberJoined, TeamFailed, TeamFormed, TeamOpened, TeamRecord
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.storage.db import dialect_insert
from groupbuy.storage.events import Event
from groupbuy.storage.timefmt import from_ms, iso_ms


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
    flush inside a confirm used to wait on one statement per record); the rare endings
    update their team after that, and one executemany raises the version of the teams the
    other records changed. Rows applied before are skipped and a version never goes down,
    so a batch applied twice changes nothing.
    """
    teams: list[dict[str, Any]] = []
    members: list[dict[str, Any]] = []
    endings: list[tuple[TeamFormed | TeamFailed, str, str]] = []
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
    for f, status, column in endings:
        await session.execute(
            update(TeamRow)
            .where(TeamRow.activity_id == f["activity_id"], TeamRow.team_id == f["team_id"])
            .values(status=status, **{column: from_ms(int(f["at_ms"]))})
        )
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
        if "version" in f:
            team = (f["activity_id"], f["team_id"])
            versions[team] = max(versions.get(team, 0), int(f["version"]))
    return versions


def _versioned(event: Event, f: TeamRecord) -> Event:
    """The event with the team's version after the change in its data (records written
    before teams had versions carry none)."""
    if "version" in f:
        event.data["version"] = int(f["version"])
    return event


def _project(
    f: TeamRecord,
    teams: list[dict[str, Any]],
    members: list[dict[str, Any]],
    endings: list[tuple[TeamFormed | TeamFailed, str, str]],
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
        return Event(kind, at_ms, codec.team_event_key(kind, aid, tid), data)
    if f["type"] == "team.member_joined":
        members.append(_member_row(f, f["user_id"], int(f["seq"])))
        data = {**base, "user_id": f["user_id"], "order_id": f["order_id"] or None}
        return Event(kind, at_ms, codec.team_event_key(kind, aid, tid, f["user_id"]), data)
    if f["type"] == "team.formed" or f["type"] == "team.failed":
        members_data: dict[str, Any] = {**base, "members": _members(f["members"])}
        if f["type"] == "team.formed":
            endings.append((f, "formed", "formed_at"))
            members_data["virtual_seats"] = int(f.get("virtual_seats", 0))
        else:
            endings.append((f, "failed", "failed_at"))
        return Event(kind, at_ms, codec.team_event_key(kind, aid, tid), members_data)
    if f["type"] == "lock.expired":
        locked_at_ms = int(f["locked_at_ms"])
        data = {
            **base,
            "user_id": f["user_id"],
            "locked_at": iso_ms(locked_at_ms),
            "expired_at": iso_ms(at_ms),
        }
        key = codec.team_event_key(kind, aid, tid, f["user_id"], locked_at_ms)
        return Event(kind, at_ms, key, data)
    raise ValueError(f"unknown team record type {kind!r}")
