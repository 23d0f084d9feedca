"""A batch of failed attempts written together (SQLite and PostgreSQL): each delivery gets
its own next try, an endpoint's failing time starts once, and a 410 or a long failure
disables an endpoint once, with one `endpoint.disabled` event."""

from __future__ import annotations

from sqlalchemy import select, update

from groupbuy.storage.db import Database
from groupbuy.storage.events import read_feed
from groupbuy.webhooks import queue
from groupbuy.webhooks.models import DeliveryRow, EndpointRow
from groupbuy.webhooks.outcomes import Completion, Outcome, complete
from groupbuy.webhooks.sender import Reply
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.webhooks import FakeClock, feed, team_event

DAY_MS = 86_400_000


def failed(claimed: queue.Claimed, status: int, at_ms: int) -> Outcome:
    return Outcome(claimed, Reply(status, None, 5, b""), at_ms)


async def test_a_batch_of_failures_over_several_endpoints(
    db: Database, hooks: WebhookService, clock: FakeClock
) -> None:
    for name in ("gone", "slow", "sick"):
        await hooks.create(EndpointSpec(name, f"http://127.0.0.1:9/{name}", ("*",)))
    await feed(db, *[team_event("team.opened", f"t{n}", 1) for n in range(3)])
    await queue.derive(db, clock())
    owner = queue.new_owner()
    claims = {
        name: await queue.claim(db, name, clock(), 8, 60_000, owner)
        for name in ("gone", "slow", "sick")
    }
    # "sick" has failed for longer than disable_after already.
    async with db.transaction() as session:
        await session.execute(
            update(EndpointRow)
            .where(EndpointRow.endpoint_id == "sick")
            .values(failing_since_ms=clock() - 2 * DAY_MS)
        )
    now = clock()
    outcomes = [
        failed(claims["slow"][0], 500, now),
        failed(claims["gone"][0], 410, now),
        failed(claims["sick"][0], 500, now),
        failed(claims["slow"][1], 500, now + 1),
        failed(claims["gone"][1], 500, now + 1),
        failed(claims["sick"][1], 503, now + 1),
        failed(claims["gone"][2], 410, now + 2),
    ]
    completions = await complete(db, outcomes, disable_after_ms=DAY_MS)
    assert completions == [
        Completion("pending"),
        Completion("pending", "gone"),
        Completion("pending", "failing"),
        Completion("pending"),
        Completion("pending"),
        Completion("pending"),
        Completion("pending"),
    ]
    async with db.sessions() as session:
        endpoints = {
            e: (bool(d), r, f)
            for e, d, r, f in (
                await session.execute(
                    select(
                        EndpointRow.endpoint_id,
                        EndpointRow.disabled,
                        EndpointRow.disabled_reason,
                        EndpointRow.failing_since_ms,
                    )
                )
            ).all()
        }
        rows = {
            (e, p): (s, t, n, c)
            for e, p, s, t, n, c in (
                await session.execute(
                    select(
                        DeliveryRow.endpoint_id,
                        DeliveryRow.event_position,
                        DeliveryRow.status,
                        DeliveryRow.tries,
                        DeliveryRow.next_ms,
                        DeliveryRow.claim_token,
                    )
                )
            ).all()
        }
    assert endpoints["gone"] == (True, "gone", now + 1)
    assert endpoints["slow"] == (False, None, now)
    assert endpoints["sick"] == (True, "failing", now - 2 * DAY_MS)
    # A 410 leaves its delivery due at once and untried; a failure schedules the next try.
    assert rows[("gone", 1)] == ("pending", 0, now, None)
    assert rows[("gone", 3)] == ("pending", 0, now + 2, None)
    for key, at in ((("slow", 1), now), (("slow", 2), now + 1), (("gone", 2), now + 1)):
        status, tries, next_ms, token = rows[key]
        assert (status, tries, token) == ("pending", 1, None)
        assert 4_000 <= next_ms - at <= 6_000
    disabled = (await read_feed(db, 3, 100))["events"]
    assert sorted((e["type"], e["data"]["endpoint_id"]) for e in disabled) == [
        ("endpoint.disabled", "gone"),
        ("endpoint.disabled", "sick"),
    ]
