"""Deliveries in SQL: derived from the events feed, claimed by one process at a time,
completed with their attempt, listed, replayed.

A claim is a token and a deadline on the row (`claim_token`, `claim_until_ms`), taken by a
conditional UPDATE: two processes cannot both hold one delivery, and a process killed
mid-attempt leaves a claim that expires, after which another takes the delivery (at least
once; the receiver dedups by `webhook-id`). Each claim transaction first writes the
endpoint's row, which serialises claims per endpoint: a row lock on PostgreSQL, the write
lock on SQLite (taken before the reads that count what is in flight).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    Table,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from groupbuy.storage.db import Database, dialect_insert
from groupbuy.storage.events import Event, EventRow, assign_positions, record_event
from groupbuy.storage.timefmt import iso_ms, to_ms
from groupbuy.webhooks.models import AttemptRow, DeliveryRow, EndpointRow
from groupbuy.webhooks.schedule import RETRY_AFTER_STATUSES, parse_retry_after, retry_wait_ms
from groupbuy.webhooks.sender import Reply
from groupbuy.webhooks.store import subscribes

# Events one derivation reads per endpoint: bounds a transaction behind a large backlog.
DERIVE_BATCH = 2000
# Events one replay transaction queues.
REPLAY_BATCH = 2000
STATUSES = ("pending", "delivered", "failed")
DISABLED_EVENT = "endpoint.disabled"
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


def _delivery(
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
                _delivery(member, int(p or 0), kind, data, now_ms)
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


@dataclass(frozen=True)
class Completion:
    """What recording an attempt decided: the delivery's status, and whether the endpoint
    was disabled by it (and why)."""

    status: str
    disabled: str | None = None


@dataclass(frozen=True)
class Outcome:
    """One ended attempt to record: the claim it ran under, the reply, when it ended."""

    claimed: Claimed
    reply: Reply
    ended_ms: int


async def complete(
    database: Database, outcomes: list[Outcome], disable_after_ms: int, max_answer: int = 1024
) -> list[Completion]:
    """Record attempts, in one transaction, and what follows from each: delivered on a 2xx;
    on a 410 the endpoint is disabled and the delivery stays pending; otherwise the next try
    is scheduled (a Retry-After on 429/503 counted) or, past the schedule, the delivery has
    failed; an endpoint that has failed for `disable_after_ms` is disabled. An
    `endpoint.disabled` event enters the feed once per disabling. A delivery changes only
    under the claim the attempt ran with (a claim that expired and was taken over by
    another process leaves the delivery to that process; the attempt is still recorded)."""
    if not outcomes:
        return []
    async with database.transaction() as session:
        await session.execute(
            insert(AttemptRow),
            [
                {
                    "delivery_id": o.claimed.delivery_id,
                    "at_ms": o.ended_ms,
                    "status_code": o.reply.status_code,
                    "error": o.reply.error,
                    "duration_ms": o.reply.duration_ms,
                    "answer": o.reply.answer[:max_answer].decode("utf-8", "replace"),
                }
                for o in outcomes
            ],
        )
        succeeded = [o for o in outcomes if o.reply.succeeded]
        if succeeded:
            # executemany: one round trip for the whole batch's successes.
            table = cast(Table, DeliveryRow.__table__)
            await session.execute(
                update(table)
                .where(
                    table.c.id == bindparam("delivery"), table.c.claim_token == bindparam("token")
                )
                .values(
                    status="delivered",
                    tries=table.c.tries + 1,
                    claim_token=None,
                    claim_until_ms=None,
                    ended_ms=bindparam("ended"),
                ),
                [
                    {
                        "delivery": o.claimed.delivery_id,
                        "token": o.claimed.token,
                        "ended": o.ended_ms,
                    }
                    for o in succeeded
                ],
            )
            for endpoint_id in sorted({o.claimed.endpoint_id for o in succeeded}):
                await session.execute(
                    update(EndpointRow)
                    .where(
                        EndpointRow.endpoint_id == endpoint_id,
                        EndpointRow.failing_since_ms.is_not(None),
                    )
                    .values(failing_since_ms=None)
                )
        # Failures take endpoint rows too: in endpoint order, as derive does.
        decided: dict[int, Completion] = {}
        for index in sorted(range(len(outcomes)), key=lambda i: outcomes[i].claimed.endpoint_id):
            if not outcomes[index].reply.succeeded:
                decided[index] = await _failed(session, outcomes[index], disable_after_ms)
        return [decided.get(i, Completion("delivered")) for i in range(len(outcomes))]


async def _failed(session: AsyncSession, outcome: Outcome, disable_after_ms: int) -> Completion:
    claimed, reply, now_ms = outcome.claimed, outcome.reply, outcome.ended_ms
    mine = (DeliveryRow.id == claimed.delivery_id) & (DeliveryRow.claim_token == claimed.token)
    released = {"claim_token": None, "claim_until_ms": None, "ended_ms": now_ms}
    endpoint = EndpointRow.endpoint_id == claimed.endpoint_id
    if reply.status_code == 410:
        # Stays pending, due at once: enabling the endpoint again sends it first.
        await session.execute(update(DeliveryRow).where(mine).values(next_ms=now_ms, **released))
        disabled = await _disable(session, claimed.endpoint_id, "gone", now_ms)
        return Completion("pending", "gone" if disabled else None)
    retry_after = None
    if reply.status_code in RETRY_AFTER_STATUSES:
        retry_after = parse_retry_after(reply.retry_after, now_ms)
    wait = retry_wait_ms(claimed.tries + 1, retry_after)
    status = "failed" if wait is None else "pending"
    await session.execute(
        update(DeliveryRow)
        .where(mine)
        .values(
            status=status, tries=DeliveryRow.tries + 1, next_ms=now_ms + (wait or 0), **released
        )
    )
    await session.execute(
        update(EndpointRow)
        .where(endpoint, EndpointRow.failing_since_ms.is_(None))
        .values(failing_since_ms=now_ms)
    )
    since = await session.scalar(select(EndpointRow.failing_since_ms).where(endpoint))
    failing_long = since is not None and now_ms - since >= disable_after_ms
    if failing_long and await _disable(session, claimed.endpoint_id, "failing", now_ms):
        return Completion(status, "failing")
    return Completion(status)


async def _disable(session: AsyncSession, endpoint_id: str, reason: str, now_ms: int) -> bool:
    """Disable an enabled endpoint and put `endpoint.disabled` in the feed; False when it was
    disabled already (so the event is written once per disabling)."""
    result = await session.execute(
        update(EndpointRow)
        .where(EndpointRow.endpoint_id == endpoint_id, EndpointRow.disabled.is_(False))
        .values(disabled=True, disabled_reason=reason)
    )
    if not cast(CursorResult[Any], result).rowcount:
        return False
    data = {"endpoint_id": endpoint_id, "reason": reason}
    key = f"{DISABLED_EVENT}:{endpoint_id}:{now_ms}"
    await record_event(session, Event(DISABLED_EVENT, now_ms, key, data))
    return True


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


async def fail_unsendable(database: Database, claimed: Claimed, reason: str, now_ms: int) -> None:
    """End a delivery that cannot be sent at all (its body is over the bound): failed,
    with an attempt that says why, so it is listed and can be replayed once fixed."""
    async with database.transaction() as session:
        session.add(
            AttemptRow(
                delivery_id=claimed.delivery_id,
                at_ms=now_ms,
                status_code=None,
                error=reason,
                duration_ms=0,
                answer="",
            )
        )
        await session.execute(
            update(DeliveryRow)
            .where(DeliveryRow.id == claimed.delivery_id, DeliveryRow.claim_token == claimed.token)
            .values(
                status="failed",
                tries=DeliveryRow.tries + 1,
                claim_token=None,
                claim_until_ms=None,
                ended_ms=now_ms,
            )
        )


async def page(
    database: Database, endpoint_id: str, status: str | None, cursor: str | None, limit: int
) -> dict[str, Any]:
    """An endpoint's deliveries whose attempt has ended, newest first, with their attempts;
    `cursor` is the previous page's `next_cursor` (`<ended_ms>.<id>`)."""
    query = select(DeliveryRow).where(
        DeliveryRow.endpoint_id == endpoint_id, DeliveryRow.ended_ms.is_not(None)
    )
    if status is not None:
        query = query.where(DeliveryRow.status == status)
    if cursor:
        ended, _dot, last = cursor.partition(".")
        query = query.where(
            or_(
                DeliveryRow.ended_ms < int(ended),
                and_(DeliveryRow.ended_ms == int(ended), DeliveryRow.id < int(last)),
            )
        )
    query = query.order_by(DeliveryRow.ended_ms.desc(), DeliveryRow.id.desc()).limit(limit + 1)
    async with database.sessions() as session:
        rows = list(await session.scalars(query))
        more = len(rows) > limit
        rows = rows[:limit]
        attempts: dict[int, list[dict[str, Any]]] = {row.id: [] for row in rows}
        if rows:
            found = await session.scalars(
                select(AttemptRow)
                .where(AttemptRow.delivery_id.in_(list(attempts)))
                .order_by(AttemptRow.id)
            )
            for attempt in found:
                attempts[attempt.delivery_id].append(_attempt_view(attempt))
    last_row = rows[-1] if rows else None
    return {
        "deliveries": [
            {
                "webhook_id": webhook_id(row.event_position),
                "event_id": row.event_position,
                "event_type": row.event_type,
                "status": row.status,
                "attempts": attempts[row.id],
            }
            for row in rows
        ],
        "next_cursor": f"{last_row.ended_ms}.{last_row.id}" if more and last_row else None,
    }


def _attempt_view(row: AttemptRow) -> dict[str, Any]:
    shown: dict[str, Any] = {"at": iso_ms(row.at_ms), "duration_ms": row.duration_ms}
    if row.status_code is not None:
        shown["status_code"] = row.status_code
    else:
        shown["error"] = row.error
    shown["answer"] = row.answer
    return shown


async def replay(
    database: Database, endpoint_id: str, types: list[str], after: int, until: int, now_ms: int
) -> int:
    """Queue the events `after < position <= until` again for the endpoint (new attempts,
    same `webhook-id`): existing deliveries start a new schedule, missing ones (events from
    before the endpoint existed) are added. Events past the endpoint's position are left to
    the derivation. Returns how many events were queued."""
    queued = 0
    start = after
    while True:
        async with database.transaction() as session:
            position = await session.scalar(
                select(EndpointRow.position).where(EndpointRow.endpoint_id == endpoint_id)
            )
            if position is None:
                return queued
            upper = min(until, int(position))
            events = list(
                (
                    await session.execute(
                        select(EventRow.position, EventRow.type, EventRow.data)
                        .where(EventRow.position > start, EventRow.position <= upper)
                        .order_by(EventRow.position)
                        .limit(REPLAY_BATCH)
                    )
                ).all()
            )
            if not events:
                return queued
            rows = [
                _delivery(endpoint_id, int(p or 0), kind, data, now_ms)
                for p, kind, data in events
                if subscribes(types, kind)
            ]
            if rows:
                insert = dialect_insert(session, DeliveryRow.__table__).on_conflict_do_nothing()
                await session.execute(insert, rows)
                await session.execute(
                    update(DeliveryRow)
                    .where(
                        DeliveryRow.endpoint_id == endpoint_id,
                        DeliveryRow.event_position.in_([r["event_position"] for r in rows]),
                    )
                    .values(status="pending", tries=0, next_ms=now_ms)
                    .execution_options(synchronize_session=False)
                )
            queued += len(rows)
            start = int(events[-1][0] or 0)


async def backlog(database: Database, now_ms: int) -> dict[str, tuple[int, float]]:
    """Per endpoint: pending deliveries, and the age in seconds of the oldest event not yet
    delivered (0 when none waits)."""
    async with database.sessions() as session:
        found = await session.execute(
            select(DeliveryRow.endpoint_id, func.count(), func.min(DeliveryRow.event_position))
            .where(DeliveryRow.status == "pending")
            .group_by(DeliveryRow.endpoint_id)
        )
        counts = {str(e): (int(n), int(p)) for e, n, p in found.all()}
        ages: dict[str, float] = {}
        for endpoint_id, (_n, oldest) in counts.items():
            at = await session.scalar(select(EventRow.at).where(EventRow.position == oldest))
            ages[endpoint_id] = max(0.0, (now_ms - to_ms(at)) / 1000) if at is not None else 0.0
        every = await session.scalars(select(EndpointRow.endpoint_id))
        return {str(e): (counts.get(e, (0, 0))[0], ages.get(e, 0.0)) for e in every}
