"""A delivery pass is one probe, then one transaction whose statements do not grow with the
number of endpoints (SQLite and PostgreSQL): each step is one statement for every endpoint
at once. A pass with nothing to do is the probe alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from groupbuy.storage.db import Database
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.receiver import Receiver
from tests.support.webhooks import feed, team_event


@contextmanager
def counted(db: Database) -> Iterator[dict[str, int]]:
    """Statements and transactions begun on the database while the block runs."""
    counts = {"statements": 0, "transactions": 0}

    def statement(*_: Any) -> None:
        counts["statements"] += 1

    def begun(*_: Any) -> None:
        counts["transactions"] += 1

    engine = db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "begin", begun)
    try:
        yield counts
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "begin", begun)


async def pass_cost(db: Database, hooks: WebhookService, endpoints: int) -> dict[str, int]:
    """The statements and transactions of the pass that derives and claims new events."""
    await feed(db, *[team_event("team.opened", f"t{endpoints}-{n}", 1) for n in range(5)])
    with counted(db) as counts:
        started = await hooks.deliverer.tick()
    assert started == 5 * endpoints
    await hooks.deliverer.settle()
    return counts


async def test_a_pass_costs_the_same_for_one_endpoint_and_for_three(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
    await hooks.create(EndpointSpec("e0", receiver.url, ("*",)))
    alone = await pass_cost(db, hooks, 1)
    for name in ("e1", "e2"):
        await hooks.create(EndpointSpec(name, receiver.url, ("*",)))
    three = await pass_cost(db, hooks, 3)
    assert alone["transactions"] == three["transactions"] == 2  # the probe, the pass
    assert alone["statements"] == three["statements"]
    assert len(receiver.received) == 5 + 15


async def test_without_endpoints_a_pass_is_one_probe(db: Database, hooks: WebhookService) -> None:
    await feed(db, team_event("team.opened", "t1", 1))
    assert await hooks.deliverer.tick() == 0  # finds no endpoint
    with counted(db) as counts:
        assert await hooks.deliverer.tick() == 0
    assert counts == {"statements": 1, "transactions": 1}


async def test_a_pass_with_nothing_to_do_is_one_probe(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
    await hooks.create(EndpointSpec("e0", receiver.url, ("*",)))
    await feed(db, team_event("team.opened", "t1", 1))
    assert await hooks.deliverer.tick() == 1
    await hooks.deliverer.settle()  # the outcome is recorded (no background loop runs)
    with counted(db) as counts:
        assert await hooks.deliverer.tick() == 0
    assert counts == {"statements": 1, "transactions": 1}
    assert len(receiver.received) == 1
