"""Deliveries in SQL: what is owed and who attempts it. Deliveries are derived from the
events feed; due ones are claimed by one process at a time.

A claim is a token and a deadline on the row (`claim_token`, `claim_until_ms`), taken by a
conditional UPDATE: two processes cannot both hold one delivery, and a process killed
mid-attempt leaves a claim that expires, after which another takes the delivery (at least
once; the receiver dedups by `webhook-id`). A live process renews its claims while it holds
them, so the deadline can be short. Each claim transaction first writes the
endpoint's row, which serialises claims per endpoint: a row lock on PostgreSQL, the write
lock on SQLite (taken before the reads that count what is in flight).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, Table, and_, bindparam, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from groupbuy.storage.db import Database, dialect_insert
from groupbuy.storage.events import EventRow, assign_positions
from groupbuy.storage.timefmt import iso_ms, to_ms
from groupbuy.webhooks.models import DeliveryRow, EndpointRow
from groupbuy.webhooks.store import subscribes

# Events one derivation reads per endpoint: bounds a transaction behind a large backlog.
DERIVE_BATCH = 2000
# A claim token is the claiming process's prefix of this many characters, then a random part.
OWNER_CHARS = 16


def entity_of(event_type: str, data: dict[str, Any]) -> tuple[str, int]:
    """The entity an event belongs to (a team, a packet, an endpoint; '' for none) and its
    version after the event (0 when the event carries none)."""
    version = int(data.get("version", 0) or 0)
    if "team_id" in data:
        return f"team:{data.get('activity_id', '')}/{data['team_id']}", version
    if "packet_id" in data:
        return f"packet:{data['packet_id']}", version
    if "endpoint_id" in data:
        return f"endpoint:{data['endpoint_id']}", version
    return "", version


def webhook_id(position: int) -> str:
    """A delivery's `webhook-id`: the same on every attempt (the receiver's dedup key)."""
    return f"evt_{position}"


def message(position: int, event_type: str, at_ms: int, data: dict[str, Any]) -> bytes:
    """The body of a delivery: `{"type", "timestamp", "data": <the feed event>}`."""
    at = iso_ms(at_ms)
    body = {
        "type": event_type,
        "timestamp": at,
        "data": {"id": position, "type": event_type, "at": at, "data": data},
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True)
class Claimed:
    """A delivery this process holds, with what its attempt sends."""

    delivery_id: int
    token: str
    endpoint_id: str
    position: int
    event_type: str
    tries: int
    body: bytes

    @property
    def webhook_id(self) -> str:
        """The delivery's `webhook-id`."""
        return webhook_id(self.position)


def delivery_row(
    endpoint_id: str, position: int, event_type: str, data: str, now: int
) -> dict[str, Any]:
    entity, version = entity_of(event_type, json.loads(data))
    return {
        "endpoint_id": endpoint_id,
        "event_position": position,
        "event_type": event_type,
        "entity": entity,
        "entity_version": version,
        "status": "pending",
        "tries": 0,
        "next_ms": now,
        "ended_ms": None,
    }


async def derive(database: Database, now_ms: int) -> int:
    """Queue a delivery for each event past each endpoint's position that it subscribes to
    (disabled endpoints too: they keep their queue), and move the positions; returns how
    many were queued. Safe in several processes at once: a position moves only from the
    value read, and a delivery exists once per (endpoint, event)."""
    async with database.sessions() as session:
        # No endpoint, nothing to do: an idle service costs one probe per poll.
        if await session.scalar(select(EndpointRow.endpoint_id).limit(1)) is None:
            return 0
    await assign_positions(database)
    async with database.sessions() as session:
        top = await session.scalar(select(func.coalesce(func.max(EventRow.position), 0)))
        behind = list(
            (
                await session.execute(
                    select(
                        EndpointRow.endpoint_id, EndpointRow.position, EndpointRow.event_types
                    ).where(EndpointRow.position < (top or 0))
                )
            ).all()
        )
    # Endpoints at one position (the usual case: all caught up together) share one read of
    # the feed; every endpoint's deliveries go into one transaction, which takes the
    # endpoints' rows in id order (two processes deriving at once cannot deadlock).
    members = sorted((str(e), int(p), json.loads(t)) for e, p, t in behind)
    async with database.sessions() as session:
        reads = {p: await _events_after(session, p) for p in sorted({m[1] for m in members})}
    rows: list[dict[str, Any]] = []
    async with database.transaction() as session:
        for member, position, subscribed in members:
            events = reads[position]
            if not events:
                continue
            moved = await session.execute(
                update(EndpointRow)
                .where(EndpointRow.endpoint_id == member, EndpointRow.position == position)
                .values(position=int(events[-1][0] or 0))
            )
            if not cast(CursorResult[Any], moved).rowcount:
                continue  # another process derived these first
            rows += [
                delivery_row(member, int(p or 0), kind, data, now_ms)
                for p, kind, data in events
                if subscribes(subscribed, kind)
            ]
        if rows:
            insert = dialect_insert(session, DeliveryRow.__table__).on_conflict_do_nothing()
            await session.execute(insert, rows)
    return len(rows)


async def _events_after(session: AsyncSession, position: int) -> list[Any]:
    """Up to DERIVE_BATCH feed events after `position`: (position, type, data)."""
    found = await session.execute(
        select(EventRow.position, EventRow.type, EventRow.data)
        .where(EventRow.position > position)
        .order_by(EventRow.position)
        .limit(DERIVE_BATCH)
    )
    return list(found.all())


def _earlier_pending() -> Any:
    """For entity ordering: a pending delivery of the same endpoint and entity that comes
    before (lower version, or the same version and an earlier feed position)."""
    other = aliased(DeliveryRow)
    return (
        select(other.id)
        .where(
            other.endpoint_id == DeliveryRow.endpoint_id,
            other.entity == DeliveryRow.entity,
            other.status == "pending",
            or_(
                other.entity_version < DeliveryRow.entity_version,
                and_(
                    other.entity_version == DeliveryRow.entity_version,
                    other.event_position < DeliveryRow.event_position,
                ),
            ),
        )
        .exists()
    )


def new_owner() -> str:
    """A process's claim prefix: the first half of each claim token it takes."""
    return secrets.token_hex(OWNER_CHARS // 2)


async def claim(
    database: Database,
    endpoint_id: str,
    now_ms: int,
    limit: int,
    claim_ms: int,
    owner: str,
) -> list[Claimed]:
    """Claim the endpoint's due deliveries for the process `owner`, up to `limit` claimed at
    once, in feed order; with `ordering: "entity"` only the first pending delivery of each
    entity. None while another process holds claims on the endpoint (one process works an
    endpoint at a time, so its bound on attempts in flight holds for the endpoint), and none
    when the endpoint is disabled or gone."""
    token = owner + secrets.token_hex(OWNER_CHARS // 2)
    async with database.transaction() as session:
        held = await session.execute(
            update(EndpointRow)
            .where(EndpointRow.endpoint_id == endpoint_id, EndpointRow.disabled.is_(False))
            .values(endpoint_id=EndpointRow.endpoint_id)
            .returning(EndpointRow.ordering)
        )
        ordering = held.scalar()
        if ordering is None:
            return []
        pending = (DeliveryRow.endpoint_id == endpoint_id) & (DeliveryRow.status == "pending")
        mine = func.substr(DeliveryRow.claim_token, 1, OWNER_CHARS) == owner
        claimed = await session.execute(
            select(mine, func.count())
            .where(pending, DeliveryRow.claim_until_ms > now_ms)
            .group_by(mine)
        )
        counts = {bool(is_mine): int(n) for is_mine, n in claimed.all()}
        if counts.get(False):
            return []
        room = limit - counts.get(True, 0)
        if room <= 0:
            return []
        due = select(DeliveryRow.id).where(
            pending,
            DeliveryRow.next_ms <= now_ms,
            or_(DeliveryRow.claim_until_ms.is_(None), DeliveryRow.claim_until_ms <= now_ms),
        )
        if ordering == "entity":
            due = due.where(or_(DeliveryRow.entity == "", ~_earlier_pending()))
        ids = list(await session.scalars(due.order_by(DeliveryRow.event_position).limit(room)))
        if not ids:
            return []
        await session.execute(
            update(DeliveryRow)
            .where(DeliveryRow.id.in_(ids))
            .values(claim_token=token, claim_until_ms=now_ms + claim_ms)
            .execution_options(synchronize_session=False)
        )
        found = await session.execute(
            select(
                DeliveryRow.id,
                DeliveryRow.event_position,
                DeliveryRow.tries,
                EventRow.type,
                EventRow.at,
                EventRow.data,
            )
            .join(EventRow, EventRow.position == DeliveryRow.event_position)
            .where(DeliveryRow.id.in_(ids))
            .order_by(DeliveryRow.event_position)
        )
        return [
            Claimed(
                delivery_id=int(delivery_id),
                token=token,
                endpoint_id=endpoint_id,
                position=int(position),
                event_type=kind,
                tries=int(tries),
                body=message(int(position), kind, to_ms(at), json.loads(data)),
            )
            for delivery_id, position, tries, kind, at, data in found.all()
        ]


async def renew(database: Database, claims: list[Claimed], until_ms: int) -> None:
    """Extend claims this process still holds (its attempts are running or waiting for a
    slot) to `until_ms`; a claim already ended or taken over is left as it is."""
    table = cast(Table, DeliveryRow.__table__)
    async with database.transaction() as session:
        await session.execute(
            update(table)
            .where(
                table.c.id == bindparam("delivery"),
                table.c.claim_token == bindparam("token"),
                table.c.status == "pending",
            )
            .values(claim_until_ms=until_ms),
            [{"delivery": c.delivery_id, "token": c.token} for c in claims],
        )


async def release(database: Database, claims: list[Claimed]) -> None:
    """Give claims back unattempted (the process is stopping): due again at once, for any
    process."""
    table = cast(Table, DeliveryRow.__table__)
    async with database.transaction() as session:
        await session.execute(
            update(table)
            .where(table.c.id == bindparam("delivery"), table.c.claim_token == bindparam("token"))
            .values(claim_token=None, claim_until_ms=None),
            [{"delivery": c.delivery_id, "token": c.token} for c in claims],
        )
