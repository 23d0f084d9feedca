"""What the webhook tests share: a clock they move, events put into the feed, and every
received delivery verified with the Standard Webhooks reference library."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime
from typing import Any

import standardwebhooks.webhooks as reference
from sqlalchemy import insert

from groupbuy.storage.db import Database
from groupbuy.storage.events import Event, record_event
from groupbuy.webhooks.models import AttemptRow, DeliveryRow
from groupbuy.webhooks.queue import delivery_row
from tests.support.receiver import Received


class FakeClock:
    """Epoch milliseconds that move only when told (starts at the real time, so receivers'
    timestamp windows hold until a test moves it)."""

    def __init__(self) -> None:
        self.now_ms = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now_ms += round(seconds * 1000)


async def feed(database: Database, *events: tuple[str, dict[str, Any]], at_ms: int = 0) -> None:
    """Put events into the feed, as the engines' write-behind does (one transaction)."""
    stamp = at_ms or time.time_ns() // 1_000_000
    async with database.transaction() as session:
        for kind, data in events:
            digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
            key = f"test:{kind}:{digest}"
            await record_event(session, Event(kind, stamp, key, data))


def team_event(kind: str, team: str, version: int, **extra: Any) -> tuple[str, dict[str, Any]]:
    """A team event of activity `a1` with its version."""
    return kind, {"activity_id": "a1", "team_id": team, "version": version, **extra}


def verified(secret: str, received: Received, moved_clock: bool = False) -> Any:
    """The body of a delivery the reference library accepts as signed by `secret`; raises
    WebhookVerificationError otherwise. With `moved_clock` (the test moved time on), the
    library's ±5 min window is centred on the delivery's own timestamp."""
    if not moved_clock:
        return reference.Webhook(secret).verify(received.body, received.headers)
    sent = datetime.fromtimestamp(int(received.headers["webhook-timestamp"]), tz=UTC)

    class _Then(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return sent

    # The library reads `datetime.now` from its module: only its clock moves, not its check.
    real = getattr(reference, "datetime")  # noqa: B009
    setattr(reference, "datetime", _Then)  # noqa: B010
    try:
        return reference.Webhook(secret).verify(received.body, received.headers)
    finally:
        setattr(reference, "datetime", real)  # noqa: B010


async def delivery_tried(db: Database, endpoint_id: str, position: int, tries: int) -> None:
    """A failed delivery of the feed's event `position` with `tries` attempts (statuses
    500, 501, ... in order, at ms 1000, 2000, ...)."""
    async with db.transaction() as session:
        row = delivery_row(endpoint_id, position, "team.formed", "{}", 0)
        row.update(status="failed", ended_ms=position * 10**6)
        delivery = (
            await session.execute(insert(DeliveryRow).values(row).returning(DeliveryRow.id))
        ).scalar_one()
        for n in range(tries):
            session.add(
                AttemptRow(
                    delivery_id=delivery,
                    at_ms=(n + 1) * 1000,
                    status_code=500 + n,
                    error=None,
                    duration_ms=n,
                    answer="",
                )
            )
