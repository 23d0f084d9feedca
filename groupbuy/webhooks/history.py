"""What the admin reads and asks of deliveries: the page of deliveries with their newest
attempts, a delivery's attempts a page at a time, replays of past events, and the backlog
the metrics show."""

from __future__ import annotations

from typing import Any

from groupbuy_client import wire
from groupbuy_client.wire import ATTEMPTS_SHOWN, iso_ms, to_ms
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import aliased

from groupbuy import errors
from groupbuy.storage.db import Database, dialect_insert
from groupbuy.storage.events import EventRow
from groupbuy.webhooks.models import AttemptRow, DeliveryRow, EndpointRow
from groupbuy.webhooks.queue import delivery_row, webhook_id
from groupbuy.webhooks.store import subscribes

# Events one replay transaction queues.
REPLAY_BATCH = 2000


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
        shown = await _newest_attempts(session, [row.id for row in rows])
    last_row = rows[-1] if rows else None
    deliveries = []
    for row in rows:
        attempts, total = shown.get(row.id, ([], 0))
        deliveries.append(
            {
                "webhook_id": webhook_id(row.event_position),
                "event_id": row.event_position,
                "event_type": row.event_type,
                "status": row.status,
                "attempts": [_attempt_view(attempt) for attempt in attempts],
                "attempts_total": total,
                # Where `attempts` goes on, to the older ones: the oldest shown.
                "older_attempts_cursor": str(attempts[0].id) if total > len(attempts) else None,
            }
        )
    return {
        "deliveries": deliveries,
        "next_cursor": f"{last_row.ended_ms}.{last_row.id}" if more and last_row else None,
    }


async def _newest_attempts(
    session: Any, delivery_ids: list[int]
) -> dict[int, tuple[list[AttemptRow], int]]:
    """Per delivery: its newest ATTEMPTS_SHOWN attempts, oldest of them first, and how many
    it has. One query; the database ranks and counts, and sends only the attempts shown."""
    if not delivery_ids:
        return {}
    ranked = (
        select(
            AttemptRow,
            func.row_number()
            .over(partition_by=AttemptRow.delivery_id, order_by=AttemptRow.id.desc())
            .label("newest"),
            func.count().over(partition_by=AttemptRow.delivery_id).label("total"),
        )
        .where(AttemptRow.delivery_id.in_(delivery_ids))
        .subquery()
    )
    attempt = aliased(AttemptRow, ranked)
    found = await session.execute(
        select(attempt, ranked.c.total)
        .where(ranked.c.newest <= ATTEMPTS_SHOWN)
        .order_by(ranked.c.delivery_id, ranked.c.id)
    )
    shown: dict[int, tuple[list[AttemptRow], int]] = {}
    for row, total in found.all():
        shown.setdefault(row.delivery_id, ([], int(total)))[0].append(row)
    return shown


async def attempts(
    database: Database, endpoint_id: str, webhook: str, cursor: str | None, limit: int
) -> dict[str, Any]:
    """One delivery's attempts, newest first, a page at a time; `cursor` is the previous
    page's `next_cursor` or a delivery's `older_attempts_cursor` (an attempt id)."""
    position = event_position(webhook)
    async with database.sessions() as session:
        delivery = await session.scalar(
            select(DeliveryRow.id).where(
                DeliveryRow.endpoint_id == endpoint_id, DeliveryRow.event_position == position
            )
        )
        if delivery is None:
            raise errors.DeliveryNotFound(f"endpoint {endpoint_id} has no delivery {webhook}")
        query = select(AttemptRow).where(AttemptRow.delivery_id == delivery)
        if cursor:
            query = query.where(AttemptRow.id < int(cursor))
        rows = list(await session.scalars(query.order_by(AttemptRow.id.desc()).limit(limit + 1)))
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "webhook_id": webhook,
        "attempts": [_attempt_view(row) for row in rows],
        "next_cursor": str(rows[-1].id) if more and rows else None,
    }


def event_position(webhook: str) -> int:
    """The feed id of a delivery's `webhook-id` (`evt_<feed id>`); DeliveryNotFound for
    anything else (a `test_` id is never a delivery)."""
    prefix, _underscore, digits = webhook.partition("_")
    if prefix == "evt" and digits.isascii() and digits.isdigit() and len(digits) <= 18:
        position = int(digits)
        if webhook == webhook_id(position):  # one spelling: evt_7, not evt_07
            return position
    raise errors.DeliveryNotFound(f"no delivery has the webhook id {webhook}")


def _attempt_view(row: AttemptRow) -> wire.WebhookAttempt:
    at = iso_ms(row.at_ms)
    if row.status_code is not None:
        return {
            "at": at,
            "duration_ms": row.duration_ms,
            "status_code": row.status_code,
            "answer": row.answer,
        }
    return {"at": at, "duration_ms": row.duration_ms, "error": row.error, "answer": row.answer}


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
        async with database.transaction(urgent=True) as session:
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
                delivery_row(endpoint_id, int(p or 0), kind, data, now_ms)
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
