"""The deliverer against a real receiver on loopback, on SQLite and PostgreSQL: what a
delivery carries, the retry schedule on a clock the test moves, 410 and disable_after_s,
ordering, claims, timeouts, redirects and oversized answers. Every delivery is verified
with the Standard Webhooks reference library."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqlalchemy import select

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.storage.events import read_feed
from groupbuy.webhooks import queue
from groupbuy.webhooks.models import DeliveryRow
from groupbuy.webhooks.schedule import RETRY_WAITS_S
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.receiver import Receiver, arrived
from tests.support.webhooks import FakeClock, feed, team_event, verified


async def register(
    hooks: WebhookService, receiver: Receiver, types: tuple[str, ...] = ("*",), **extra: Any
) -> str:
    created = await hooks.create(EndpointSpec("shop", receiver.url, types, **extra))
    return str(created.body["secret"])


async def run_pass(hooks: WebhookService) -> int:
    """One deliverer pass, then wait for its attempts to be recorded."""
    started = await hooks.deliverer.tick()
    await hooks.deliverer.settle()
    return started


async def statuses(db: Database) -> list[tuple[int, str, int]]:
    async with db.sessions() as session:
        rows = await session.execute(
            select(DeliveryRow.event_position, DeliveryRow.status, DeliveryRow.tries).order_by(
                DeliveryRow.event_position
            )
        )
        return [(int(p), str(s), int(t)) for p, s, t in rows.all()]


async def test_a_delivery_is_a_signed_post_of_the_feed_event(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
    secret = await register(hooks, receiver, ("team.formed",))
    await feed(
        db,
        team_event("team.opened", "t1", 1, leader_id="u1"),
        team_event("team.formed", "t1", 3, members=[{"user_id": "u1"}]),
    )
    assert await run_pass(hooks) == 1
    [got] = receiver.received
    body = verified(secret, got)
    page = await read_feed(db, 0, 10)
    formed = page["events"][1]
    assert body == {"type": "team.formed", "timestamp": formed["at"], "data": formed}
    assert got.headers["webhook-id"] == f"evt_{formed['id']}"
    assert got.headers["content-type"] == "application/json"
    assert await statuses(db) == [(2, "delivered", 1)]
    listed = await hooks.deliveries("shop", None, None, 10)
    [delivery] = listed["deliveries"]
    assert delivery["webhook_id"] == "evt_2" and delivery["status"] == "delivered"
    assert delivery["attempts"][0]["status_code"] == 200
    assert delivery["attempts"][0]["answer"] == "answer 200"


async def test_failures_follow_the_schedule_to_failed_on_a_moved_clock(
    db: Database, hooks: WebhookService, receiver: Receiver, clock: FakeClock
) -> None:
    secret = await register(hooks, receiver)
    receiver.answer_with(default="500")
    await feed(db, team_event("team.formed", "t1", 3))
    await run_pass(hooks)
    assert len(receiver.received) == 1
    for step, wait_s in enumerate(RETRY_WAITS_S, start=1):
        clock.advance(wait_s * 0.79)  # before the earliest jittered time: not due
        assert await run_pass(hooks) == 0
        clock.advance(wait_s * 0.42)  # past the latest one: due
        assert await run_pass(hooks) == 1
        assert len(receiver.received) == step + 1
    assert await statuses(db) == [(1, "failed", 8)]
    clock.advance(10**6)
    assert await run_pass(hooks) == 0
    ids = {r.headers["webhook-id"] for r in receiver.received}
    assert ids == {"evt_1"}
    for got in receiver.received:
        verified(secret, got, moved_clock=True)
    failed = await hooks.deliveries("shop", "failed", None, 10)
    assert len(failed["deliveries"][0]["attempts"]) == 8


async def test_a_longer_retry_after_replaces_the_wait(
    db: Database, hooks: WebhookService, receiver: Receiver, clock: FakeClock
) -> None:
    await register(hooks, receiver)
    receiver.answer_with("429:120")
    await feed(db, team_event("team.formed", "t1", 3))
    await run_pass(hooks)
    clock.advance(7)  # past the first step's 5 s (+20 %), short of Retry-After
    assert await run_pass(hooks) == 0
    clock.advance(114)
    assert await run_pass(hooks) == 1
    assert await statuses(db) == [(1, "delivered", 2)]


async def test_a_410_disables_the_endpoint_which_keeps_its_queue(
    db: Database, hooks: WebhookService, receiver: Receiver, clock: FakeClock
) -> None:
    secret = await register(hooks, receiver, ("team.formed",))
    receiver.answer_with("410")
    await feed(db, team_event("team.formed", "t1", 3))
    await run_pass(hooks)
    shown = await hooks.get("shop")
    assert shown["disabled"] and shown["disabled_reason"] == "gone"
    assert await statuses(db) == [(1, "pending", 0)]
    page = await read_feed(db, 0, 10)
    disabled = [e for e in page["events"] if e["type"] == "endpoint.disabled"]
    assert [e["data"] for e in disabled] == [{"endpoint_id": "shop", "reason": "gone"}]
    # Events keep coming while it is disabled: queued, not sent, not dropped.
    await feed(db, team_event("team.formed", "t2", 3))
    clock.advance(3600)
    assert await run_pass(hooks) == 0
    assert len(receiver.received) == 1
    await hooks.update("shop", {"disabled": False})
    await run_pass(hooks)
    assert [
        verified(secret, r, moved_clock=True)["data"]["data"]["team_id"]
        for r in receiver.received[1:]
    ] == ["t1", "t2"]
    assert [s for _p, s, _t in await statuses(db)] == ["delivered", "delivered"]


async def test_after_a_410_what_the_workers_had_not_taken_is_not_sent(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
    await register(hooks, receiver, ("team.formed",))
    receiver.answer_with(default="410")
    await feed(db, *[team_event("team.formed", f"t{n}", 3) for n in range(40)])
    claimed = await run_pass(hooks)
    in_flight = hooks.settings.max_in_flight
    assert claimed > in_flight  # more were claimed than one round of workers takes
    assert (await hooks.get("shop"))["disabled"]
    # Only the attempts under way when the 410 came were sent; the rest wait, unclaimed.
    assert len(receiver.received) <= in_flight
    await run_pass(hooks)  # gives the others back
    async with db.sessions() as session:
        claims = (await session.scalars(select(DeliveryRow.claim_token))).all()
    assert claims == [None] * 40
    receiver.answer_with(default="200")
    await hooks.update("shop", {"disabled": False})
    while await run_pass(hooks):
        pass
    assert [s for _p, s, _t in await statuses(db)] == ["delivered"] * 40


async def test_an_endpoint_failing_for_disable_after_s_is_disabled(
    db: Database, receiver: Receiver, clock: FakeClock
) -> None:
    settings = WebhookSettings(
        allow_http=True, allow_private_networks=True, timeout_s=1.0, disable_after_s=3600
    )
    hooks = WebhookService(db, settings, clock=clock)
    try:
        await register(hooks, receiver)
        receiver.answer_with(default="500")
        await feed(db, team_event("team.formed", "t1", 3))
        await run_pass(hooks)
        clock.advance(6)
        await run_pass(hooks)
        assert not (await hooks.get("shop"))["disabled"]
        clock.advance(400)
        await run_pass(hooks)
        assert not (await hooks.get("shop"))["disabled"]
        clock.advance(3600)
        await run_pass(hooks)
        shown = await hooks.get("shop")
        assert shown["disabled"] and shown["disabled_reason"] == "failing"
        events = (await read_feed(db, 0, 10))["events"]
        assert [e["data"]["reason"] for e in events if e["type"] == "endpoint.disabled"] == [
            "failing"
        ]
        assert (await statuses(db))[0][1] == "pending"
    finally:
        await hooks.deliverer.stop()


async def test_entity_ordering_holds_an_entitys_later_events_behind_a_failing_one(
    db: Database, hooks: WebhookService, receiver: Receiver, clock: FakeClock
) -> None:
    await register(hooks, receiver, ordering="entity")
    receiver.answer_with("500")  # the first attempt fails, then every answer is 200
    await feed(
        db,
        team_event("team.opened", "t1", 1),
        team_event("team.member_joined", "t1", 2, user_id="u2"),
        team_event("team.opened", "t2", 1),
        team_event("team.formed", "t1", 3),
    )
    await run_pass(hooks)
    first = [(r.headers["webhook-id"], r.answer) for r in receiver.received]
    # t1's first event failed; t2's went on; t1's later events wait.
    assert first == [("evt_1", "500"), ("evt_3", "200")]
    assert await run_pass(hooks) == 0
    clock.advance(6.5)
    await run_pass(hooks)
    await run_pass(hooks)
    await run_pass(hooks)
    order = [r.headers["webhook-id"] for r in receiver.received]
    assert order == ["evt_1", "evt_3", "evt_1", "evt_2", "evt_4"]


async def test_feed_ordering_goes_on_past_a_failing_delivery(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
    await register(hooks, receiver)
    receiver.answer_with("500")
    await feed(db, team_event("team.opened", "t1", 1), team_event("team.formed", "t1", 3))
    await run_pass(hooks)
    assert sorted(r.headers["webhook-id"] for r in receiver.received) == ["evt_1", "evt_2"]


async def test_in_flight_attempts_per_endpoint_are_bounded_and_one_process_works_it(
    db: Database, hooks: WebhookService, receiver: Receiver, clock: FakeClock
) -> None:
    receiver.hang_s = 0.3
    receiver.answer_with(default="hang")
    await register(hooks, receiver)
    await feed(db, *(team_event("team.opened", f"t{i}", 1) for i in range(40)))
    # It claims four rounds of max_in_flight (4 in the tests' settings) at once ...
    assert await hooks.deliverer.tick() == 16
    # ... and while it holds them, another process claims none of the endpoint's.
    other = WebhookService(db, hooks.settings, clock=clock)
    try:
        assert await other.deliverer.tick() == 0
    finally:
        await other.deliverer.stop()
    await arrived(receiver, 4)
    await hooks.deliverer.settle()
    assert receiver.most_active == 4  # never more attempts at once than max_in_flight
    assert len(receiver.received) == 16


async def test_one_delivery_is_claimed_by_one_process_and_an_expired_claim_is_taken_over(
    db: Database, hooks: WebhookService, receiver: Receiver, clock: FakeClock
) -> None:
    await register(hooks, receiver)
    await feed(db, team_event("team.formed", "t1", 3))
    await queue.derive(db, clock())
    # A process claims it and dies before attempting (kill -9: its claim stays).
    claim_ms = 31_000
    dead = queue.new_owner()
    [held] = await queue.claim(db, "shop", clock(), 8, claim_ms, dead)
    assert await queue.claim(db, "shop", clock(), 8, claim_ms, dead) == []
    assert await queue.claim(db, "shop", clock(), 8, claim_ms, queue.new_owner()) == []
    other = WebhookService(db, hooks.settings, clock=clock)
    try:
        assert await run_pass(other) == 0
        clock.advance(claim_ms / 1000 + 1)
        assert await run_pass(other) == 1
    finally:
        await other.deliverer.stop()
    assert [r.headers["webhook-id"] for r in receiver.received] == [held.webhook_id]
    assert await statuses(db) == [(1, "delivered", 1)]


async def test_two_deliverers_at_once_attempt_each_delivery_once(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
    settings = WebhookSettings(
        allow_http=True, allow_private_networks=True, timeout_s=2.0, max_in_flight=8
    )
    first = WebhookService(db, settings)
    second = WebhookService(db, settings)
    await register(hooks, receiver)
    await feed(db, *(team_event("team.opened", f"t{i}", 1) for i in range(40)))
    try:
        for _ in range(20):
            await asyncio.gather(first.deliverer.tick(), second.deliverer.tick())
            await asyncio.gather(first.deliverer.settle(), second.deliverer.settle())
    finally:
        await first.deliverer.stop()
        await second.deliverer.stop()
    ids = [r.headers["webhook-id"] for r in receiver.received]
    assert sorted(ids) == sorted(f"evt_{n}" for n in range(1, 41))
    assert all(s == "delivered" for _p, s, _t in await statuses(db))


@pytest.mark.parametrize(
    ("answer", "error", "status_code"),
    [("hang", "timeout", None), ("cut", None, None), ("307", None, 307)],
)
async def test_timeouts_cut_answers_and_redirects_are_failures(
    db: Database,
    hooks: WebhookService,
    receiver: Receiver,
    answer: str,
    error: str | None,
    status_code: int | None,
) -> None:
    receiver.hang_s = 3.0
    await register(hooks, receiver)
    receiver.answer_with(answer)
    await feed(db, team_event("team.formed", "t1", 3))
    await run_pass(hooks)
    assert await statuses(db) == [(1, "pending", 1)]
    [delivery] = (await hooks.deliveries("shop", "pending", None, 10))["deliveries"]
    [attempt] = delivery["attempts"]
    assert attempt.get("status_code") == status_code
    if error is not None:
        assert attempt["error"] == error
    if status_code is None:
        assert attempt["error"]
    # a redirect is not followed
    assert [r.answer for r in receiver.received] == [answer]


async def test_at_most_64_kib_of_an_answer_is_read_and_1_kib_kept(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
    await register(hooks, receiver)
    receiver.answer_with("big")
    await feed(db, team_event("team.formed", "t1", 3))
    await run_pass(hooks)
    [delivery] = (await hooks.deliveries("shop", None, None, 10))["deliveries"]
    assert delivery["status"] == "delivered"
    assert delivery["attempts"][0]["answer"] == "x" * 1024


async def test_replay_queues_past_events_again_with_the_same_webhook_id(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
    await feed(db, team_event("team.formed", "t0", 3))  # before the endpoint existed
    secret = await register(hooks, receiver, ("team.formed",))
    await feed(db, team_event("team.formed", "t1", 3), team_event("team.opened", "t2", 1))
    await run_pass(hooks)
    assert [r.headers["webhook-id"] for r in receiver.received] == ["evt_2"]
    answer = await hooks.replay("shop", 0, None)
    assert answer["queued"] == 2  # evt_1 (new) and evt_2 (again); evt_3 is not subscribed
    await run_pass(hooks)
    ids = [r.headers["webhook-id"] for r in receiver.received]
    assert sorted(ids[1:]) == ["evt_1", "evt_2"]
    for got in receiver.received:
        assert json.loads(got.body)["type"] == "team.formed"
        verified(secret, got)


async def test_the_test_ping_is_sent_now_and_is_not_a_delivery(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
    secret = await register(hooks, receiver, ("team.formed",))
    attempt = await hooks.test("shop")
    assert attempt["status_code"] == 200 and attempt["succeeded"]
    [got] = receiver.received
    assert got.headers["webhook-id"] == attempt["webhook_id"]
    assert attempt["webhook_id"].startswith("test_")
    assert verified(secret, got)["type"] == "webhook.test"
    assert await statuses(db) == []


async def test_metrics_measure_queue_depth_and_lag(
    db: Database, hooks: WebhookService, receiver: Receiver, clock: FakeClock
) -> None:
    await register(hooks, receiver)
    receiver.answer_with(default="500")
    await feed(db, team_event("team.formed", "t1", 3), at_ms=clock() - 5000)
    await run_pass(hooks)
    measured = await hooks.measure()
    depth, lag = measured["shop"]
    assert depth == 1 and 4.5 <= lag <= 6
    receiver.answer_with(default="200")
    clock.advance(7)
    await run_pass(hooks)
    assert (await hooks.measure())["shop"] == (0, 0.0)


async def test_a_body_over_the_bound_is_not_sent_and_fails_with_the_reason(
    db: Database, receiver: Receiver, clock: FakeClock
) -> None:
    settings = WebhookSettings(allow_http=True, allow_private_networks=True, max_payload_bytes=1024)
    hooks = WebhookService(db, settings, clock=clock)
    try:
        await register(hooks, receiver)
        await feed(db, team_event("team.formed", "t1", 3, note="x" * 2000))
        await feed(db, team_event("team.formed", "t2", 3))
        await run_pass(hooks)
        assert [r.headers["webhook-id"] for r in receiver.received] == ["evt_2"]
        failed = (await hooks.deliveries("shop", "failed", None, 10))["deliveries"]
        [attempt] = failed[0]["attempts"]
        assert failed[0]["webhook_id"] == "evt_1"
        assert attempt["error"].startswith("payload_too_large")
    finally:
        await hooks.deliverer.stop()


async def test_derivation_serves_endpoints_at_different_positions_once_each(
    db: Database, hooks: WebhookService, receiver: Receiver, clock: FakeClock
) -> None:
    await feed(db, team_event("team.opened", "t1", 1))
    await hooks.create(EndpointSpec("early", receiver.url, ("*",)))
    await feed(db, team_event("team.opened", "t2", 1), team_event("team.formed", "t2", 3))
    await hooks.create(EndpointSpec("late", receiver.url, ("team.formed",)))
    await feed(db, team_event("team.formed", "t3", 3))
    # Two processes derive at once: every delivery exists once.
    queued = await asyncio.gather(queue.derive(db, clock()), queue.derive(db, clock()))
    assert sum(queued) == 4
    async with db.sessions() as session:
        rows = await session.execute(
            select(DeliveryRow.endpoint_id, DeliveryRow.event_position).order_by(
                DeliveryRow.endpoint_id, DeliveryRow.event_position
            )
        )
        assert [(e, int(p)) for e, p in rows.all()] == [
            ("early", 2),
            ("early", 3),
            ("early", 4),
            ("late", 4),
        ]
    assert [e["position"] for e in (await hooks.page(None, 10))["webhooks"]] == [4, 4]
