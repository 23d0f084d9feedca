"""`webhooks.own_thread`: the deliverer on a thread of its own (SQLite and PostgreSQL)
delivers every event once, signed, is woken from the request loop, lets an attempt in
flight end at stop, and leaves no thread behind."""

from __future__ import annotations

import threading

from sqlalchemy import select

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks.models import DeliveryRow
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.receiver import Receiver, arrived
from tests.support.webhooks import feed, team_event, verified

# Loopback receivers over plain HTTP, short attempts, the deliverer on its own thread.
ON_THREAD = WebhookSettings(
    allow_http=True, allow_private_networks=True, timeout_s=1.0, max_in_flight=4, own_thread=True
)
# No pass starts on its own within a test: only a wake (or the start) starts one.
ON_THREAD_SLOW_POLL = ON_THREAD.model_copy(update={"poll_interval_s": 60.0})


def deliverer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "webhook-deliverer"]


async def statuses(db: Database) -> list[str]:
    async with db.sessions() as session:
        rows = await session.scalars(select(DeliveryRow.status).order_by(DeliveryRow.id))
        return list(rows)


async def test_the_thread_delivers_every_event_once_and_stops(
    db: Database, receiver: Receiver
) -> None:
    service = WebhookService(db, ON_THREAD)
    created = await service.store.create(EndpointSpec("shop", receiver.url, ("team.formed",)))
    await feed(db, *(team_event("team.formed", f"t{n}", 3) for n in range(12)))
    service.start_delivering()
    try:
        got = await arrived(receiver, 12, timeout_s=30)
    finally:
        await service.stop_delivering()
    assert deliverer_threads() == []
    secret = str(created.body["secret"])
    teams = sorted(verified(secret, r)["data"]["data"]["team_id"] for r in got)
    assert teams == sorted(f"t{n}" for n in range(12))
    assert len(receiver.received) == 12
    assert await statuses(db) == ["delivered"] * 12


async def test_a_wake_from_the_request_loop_starts_a_pass_on_the_thread(
    db: Database, receiver: Receiver
) -> None:
    service = WebhookService(db, ON_THREAD_SLOW_POLL)
    await service.store.create(EndpointSpec("shop", receiver.url, ("team.formed",)))
    await feed(db, team_event("team.formed", "first", 1))
    service.start_delivering()
    try:
        await arrived(receiver, 1, timeout_s=30)
        await feed(db, team_event("team.formed", "second", 1))
        service.wake()  # without it the next pass is 60 s away
        got = await arrived(receiver, 2, timeout_s=10)
    finally:
        await service.stop_delivering()
    assert len(got) == 2


async def test_stop_lets_the_attempt_in_flight_end_and_records_it(
    db: Database, receiver: Receiver
) -> None:
    service = WebhookService(db, ON_THREAD)
    await service.store.create(EndpointSpec("shop", receiver.url, ("team.formed",)))
    receiver.answer_with("slow:0.5")
    await feed(db, team_event("team.formed", "t1", 1))
    service.start_delivering()
    try:
        await arrived(receiver, 1, timeout_s=30)  # the attempt has begun
    finally:
        await service.stop_delivering()
    assert deliverer_threads() == []
    assert await statuses(db) == ["delivered"]


async def test_stop_before_the_thread_ran_is_clean(db: Database) -> None:
    service = WebhookService(db, ON_THREAD)
    service.start_delivering()
    await service.stop_delivering()
    await service.stop_delivering()  # twice: nothing left to stop
    assert deliverer_threads() == []
