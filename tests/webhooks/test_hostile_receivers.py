"""A receiver that answers what no receiver should (a huge or foreign Retry-After, NUL
bytes, an outcome the recording code cannot take) beside a healthy one: the healthy one
gets each event once and ends delivered; the odd one's attempts are recorded as its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks.models import AttemptRow, DeliveryRow
from groupbuy.webhooks.schedule import retry_wait_ms
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.receiver import Receiver, arrived, running_receiver
from tests.support.webhooks import feed, team_event

EVENTS = 5
FAST = WebhookSettings(
    allow_http=True,
    allow_private_networks=True,
    timeout_s=2.0,
    max_in_flight=4,
    poll_interval_s=0.05,
)


@pytest.fixture
def odd() -> Iterator[Receiver]:
    yield from running_receiver()


async def rows(db: Database, endpoint_id: str) -> list[tuple[DeliveryRow, list[AttemptRow]]]:
    """The endpoint's deliveries in feed order, each with its attempts."""
    async with db.sessions() as session:
        deliveries = list(
            await session.scalars(
                select(DeliveryRow)
                .where(DeliveryRow.endpoint_id == endpoint_id)
                .order_by(DeliveryRow.event_position)
            )
        )
        found = []
        for delivery in deliveries:
            attempts = await session.scalars(
                select(AttemptRow).where(AttemptRow.delivery_id == delivery.id)
            )
            found.append((delivery, list(attempts)))
        return found


async def side_by_side(db: Database, healthy: Receiver, odd: Receiver) -> WebhookService:
    """Both endpoints subscribed to everything, EVENTS events in the feed, passes running
    until the healthy endpoint's deliveries are all delivered and the odd one's tried."""
    hooks = WebhookService(db, FAST)
    await hooks.create(EndpointSpec("healthy", healthy.url, ("*",)))
    await hooks.create(EndpointSpec("odd", odd.url, ("*",)))
    await feed(db, *(team_event("team.opened", f"t{i}", 1) for i in range(EVENTS)))
    hooks.deliverer.start()
    try:
        await arrived(healthy, EVENTS)
        await arrived(odd, EVENTS)
        deadline = time.monotonic() + 10
        while not await _settled(db):
            assert time.monotonic() < deadline, "the outcomes were never recorded"
            await asyncio.sleep(0.05)
    finally:
        await hooks.deliverer.stop()
    return hooks


async def _settled(db: Database) -> bool:
    healthy = await rows(db, "healthy")
    odd = await rows(db, "odd")
    return all(d.status == "delivered" for d, _ in healthy) and all(attempts for _, attempts in odd)


def assert_healthy_got_each_event_once(db_rows: Any, healthy: Receiver) -> None:
    ids = [r.headers["webhook-id"] for r in healthy.received]
    assert sorted(ids) == sorted(f"evt_{n}" for n in range(1, EVENTS + 1))
    assert [(d.status, d.tries) for d, _ in db_rows] == [("delivered", 1)] * EVENTS


@pytest.mark.parametrize("retry_after", ["9" * 400, "\u00b2", "1e400", "Tue, 14 Nov 99999 00:00"])
async def test_a_hostile_retry_after_holds_back_no_other_endpoint(
    db: Database, receiver: Receiver, odd: Receiver, retry_after: str
) -> None:
    odd.answer_with(default=f"429:{retry_after}")
    await side_by_side(db, receiver, odd)
    assert_healthy_got_each_event_once(await rows(db, "healthy"), receiver)
    for delivery, attempts in await rows(db, "odd"):
        # Recorded as a 429 whose header was ignored: the schedule's own first wait.
        assert (delivery.status, delivery.tries) == ("pending", 1)
        assert [a.status_code for a in attempts] == [429]


async def test_an_answer_with_nul_bytes_is_recorded_on_every_database(
    db: Database, receiver: Receiver, odd: Receiver
) -> None:
    odd.answer_with(default="nul")
    await side_by_side(db, receiver, odd)
    assert_healthy_got_each_event_once(await rows(db, "healthy"), receiver)
    for delivery, attempts in await rows(db, "odd"):
        assert (delivery.status, delivery.tries) == ("pending", 1)
        assert [(a.status_code, a.answer) for a in attempts] == [(500, "bad\ufffdanswer")]


async def test_an_outcome_that_cannot_be_recorded_is_an_error_of_its_own_delivery(
    db: Database, receiver: Receiver, odd: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever fails while one outcome is recorded (here: a fault planted in the
    Retry-After path), the pass's other outcomes and claims still commit."""

    def planted(tries: int, retry_after_s: float | None = None) -> int | None:
        if retry_after_s is not None:
            raise RuntimeError("a fault in deciding one outcome")
        return retry_wait_ms(tries, retry_after_s)

    monkeypatch.setattr("groupbuy.webhooks.outcomes.retry_wait_ms", planted)
    odd.answer_with(default="429:30")
    await side_by_side(db, receiver, odd)
    assert_healthy_got_each_event_once(await rows(db, "healthy"), receiver)
    for delivery, attempts in await rows(db, "odd"):
        assert (delivery.status, delivery.tries) == ("pending", 1)
        assert [(a.status_code, a.error) for a in attempts] == [
            (None, "unrecordable_answer: RuntimeError")
        ]
