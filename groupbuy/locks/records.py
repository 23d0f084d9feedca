"""How the team scripts' outbox entries become SQL rows and events (idempotently)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession

from groupbuy.locks import codec
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.storage.db import insert_ignore
from groupbuy.storage.events import Event
from groupbuy.storage.timefmt import from_ms, iso_ms


def _members(encoded: str) -> list[dict[str, Any]]:
    return [m._asdict() for m in codec.parse_member_list(encoded)]


async def _insert_member(session: AsyncSession, f: dict[str, str], user_id: str, seq: int) -> None:
    await insert_ignore(
        session,
        MemberRow.__table__,
        {
            "activity_id": f["activity_id"],
            "team_id": f["team_id"],
            "user_id": user_id,
            "order_id": f.get("order_id") or None,
            "seq": seq,
            "joined_at": from_ms(int(f["at_ms"])),
        },
    )


async def _set_status(session: AsyncSession, f: dict[str, str], status: str, column: str) -> None:
    await session.execute(
        update(TeamRow)
        .where(TeamRow.activity_id == f["activity_id"], TeamRow.team_id == f["team_id"])
        .values(status=status, **{column: from_ms(int(f["at_ms"]))})
    )


async def project_team_record(session: AsyncSession, f: dict[str, str]) -> Event:
    """Apply one outbox entry of a team script to SQL and return the event it stands for."""
    kind, aid, tid, at_ms = f["type"], f["activity_id"], f["team_id"], int(f["at_ms"])
    base = {"activity_id": aid, "team_id": tid}
    if kind == "team.opened":
        await insert_ignore(
            session,
            TeamRow.__table__,
            {
                **base,
                "leader_id": f["leader_id"],
                "status": "open",
                "size": int(f["size"]),
                "created_at": from_ms(at_ms),
                "deadline_at": from_ms(int(f["deadline_ms"])),
            },
        )
        await _insert_member(session, f, f["leader_id"], 1)
        data = {**base, "leader_id": f["leader_id"], "order_id": f["order_id"] or None}
        return Event(kind, at_ms, codec.team_event_key(kind, aid, tid), data)
    if kind == "team.member_joined":
        await _insert_member(session, f, f["user_id"], int(f["seq"]))
        data = {**base, "user_id": f["user_id"], "order_id": f["order_id"] or None}
        return Event(kind, at_ms, codec.team_event_key(kind, aid, tid, f["user_id"]), data)
    if kind in ("team.formed", "team.failed"):
        status, column = (
            ("formed", "formed_at") if kind == "team.formed" else ("failed", "failed_at")
        )
        await _set_status(session, f, status, column)
        members = {**base, "members": _members(f["members"])}
        return Event(kind, at_ms, codec.team_event_key(kind, aid, tid), members)
    if kind == "lock.expired":
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
