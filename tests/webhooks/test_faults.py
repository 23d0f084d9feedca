"""Faults, each asserting that nothing is lost and nothing delivered twice beyond
at-least-once retries of one webhook-id: a receiver down for a minute during a storm, dead
endpoints beside a healthy one, a slow receiver, Redis flushed mid-storm."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterator

import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.settings import Settings, WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.storage.events import read_feed
from groupbuy.webhooks.models import DeliveryRow
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.http import ADMIN, SERVICE, assert_ok
from tests.support.receiver import (
    Receiver,
    arrived,
    running_receiver,
    start_receiver,
    stop_receiver,
)
from tests.support.webhooks import FakeClock, feed, team_event, verified

FAST = WebhookSettings(
    allow_http=True,
    allow_private_networks=True,
    timeout_s=2.0,
    max_in_flight=4,
    poll_interval_s=0.05,
)


async def drain(hooks: WebhookService, rounds: int = 50) -> None:
    """Passes until one starts nothing (bounded)."""
    for _ in range(rounds):
        started = await hooks.deliverer.tick()
        await hooks.deliverer.settle()
        if not started:
            return


async def delivered_positions(db: Database, endpoint_id: str) -> set[int]:
    async with db.sessions() as session:
        found = await session.scalars(
            select(DeliveryRow.event_position).where(
                DeliveryRow.endpoint_id == endpoint_id, DeliveryRow.status == "delivered"
            )
        )
        return {int(p) for p in found}


async def test_a_receiver_down_for_a_minute_during_a_storm_gets_every_event_in_entity_order(
    db: Database, clock: FakeClock
) -> None:
    receiver, server, thread = start_receiver()
    hooks = WebhookService(db, FAST, clock=clock)
    try:
        secret = str(
            (
                await hooks.create(EndpointSpec("shop", receiver.url, ("*",), ordering="entity"))
            ).body["secret"]
        )
        stop_receiver(server, thread)  # down
        teams, versions = [f"t{i}" for i in range(6)], range(1, 7)
        for version in versions:  # the storm, interleaved across teams, over a minute
            await feed(db, *(team_event("team.member_joined", t, version) for t in teams))
            await drain(hooks)
            clock.advance(10)
        assert receiver.received == []
        back, server, thread = start_receiver(receiver.port)  # back, same address
        for _ in range(40):
            clock.advance(600)
            await drain(hooks)
            if len(await delivered_positions(db, "shop")) == len(teams) * len(versions):
                break
        page = await read_feed(db, 0, 1000)
        assert await delivered_positions(db, "shop") == {e["id"] for e in page["events"]}
        seen: dict[str, list[int]] = defaultdict(list)
        ids = []
        for got in back.received:
            body = verified(secret, got, moved_clock=True)
            seen[body["data"]["data"]["team_id"]].append(body["data"]["data"]["version"])
            ids.append(got.headers["webhook-id"])
        assert len(ids) == len(set(ids))  # all answered 200: each once
        assert dict(seen) == {t: list(versions) for t in teams}
    finally:
        await hooks.deliverer.stop()
        stop_receiver(server, thread)


@pytest.fixture
def dead() -> Iterator[Receiver]:
    yield from running_receiver()


async def test_dead_endpoints_do_not_hold_up_a_healthy_one(
    db: Database, receiver: Receiver, dead: Receiver
) -> None:
    dead.hang_s = 30.0
    dead.answer_with(default="hang")
    settings = FAST.model_copy(update={"timeout_s": 5.0})
    hooks = WebhookService(db, settings)
    for n in range(5):
        await hooks.create(EndpointSpec(f"dead{n}", dead.url, ("*",)))
    await hooks.create(EndpointSpec("healthy", receiver.url, ("*",)))
    await feed(db, *(team_event("team.opened", f"t{i}", 1) for i in range(40)))
    started = time.monotonic()
    hooks.deliverer.start()
    try:
        await arrived(receiver, 40, timeout_s=20)
        waited = time.monotonic() - started
        # Every healthy delivery arrived while the dead ones' first attempts still hang.
        assert waited < settings.timeout_s
        for n in range(5):
            assert (await hooks.deliveries(f"dead{n}", None, None, 10))["deliveries"] == []
        assert dead.most_active <= 5 * settings.max_in_flight
    finally:
        await hooks.deliverer.stop()
    assert sorted(r.headers["webhook-id"] for r in receiver.received) == sorted(
        f"evt_{n}" for n in range(1, 41)
    )


async def test_a_slow_receiver_gets_everything_with_bounded_parallelism(
    db: Database, receiver: Receiver
) -> None:
    receiver.answer_with(default="slow:0.3")
    hooks = WebhookService(db, FAST)
    await hooks.create(EndpointSpec("shop", receiver.url, ("*",)))
    await feed(db, *(team_event("team.opened", f"t{i}", 1) for i in range(24)))
    hooks.deliverer.start()
    try:
        await arrived(receiver, 24, timeout_s=20)
        deadline = time.monotonic() + 10
        while len(await delivered_positions(db, "shop")) < 24:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
    finally:
        await hooks.deliverer.stop()
    assert receiver.most_active == FAST.max_in_flight
    assert len({r.headers["webhook-id"] for r in receiver.received}) == 24


def test_redis_flushed_mid_storm_loses_no_delivery(settings: Settings, receiver: Receiver) -> None:
    local = settings.replace(
        "webhooks", allow_http=True, allow_private_networks=True, poll_interval_s=0.05
    )
    with TestClient(create_app(local)) as c:
        created = c.post(
            "/v1/admin/webhooks",
            json={"endpoint_id": "shop", "url": receiver.url, "event_types": ["packet.sent"]},
            headers=ADMIN,
        )
        secret = assert_ok(created, 201)["secret"]
        deposit = {"amount_cents": 10_000, "reference": "r1"}
        assert_ok(c.post("/v1/accounts/alice/deposits", json=deposit, headers=ADMIN), 201)

        def send(n: int) -> None:
            packet = {"sender_id": "alice", "amount_cents": 100, "count": 1, "packet_id": f"p{n}"}
            assert_ok(c.post("/v1/redpackets", json=packet, headers=SERVICE), 201)

        for n in range(5):
            send(n)
        services = c.app.state.services  # type: ignore[attr-defined]
        c.portal.call(services.redis.flushall)  # type: ignore[union-attr]
        for n in range(5, 10):
            send(n)
        got = receiver.wait_for(10, timeout_s=20)
        feed_ids = {
            e["id"]
            for e in assert_ok(c.get("/v1/events?limit=1000", headers=SERVICE), 200)["events"]
            if e["type"] == "packet.sent"
        }
    packets = sorted(verified(secret, r)["data"]["data"]["packet_id"] for r in got)
    assert packets == sorted(f"p{n}" for n in range(10))
    assert {int(r.headers["webhook-id"].removeprefix("evt_")) for r in got} == feed_ids
