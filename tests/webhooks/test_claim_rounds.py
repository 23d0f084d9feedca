"""Claim sizes: an endpoint whose attempts succeed is claimed in larger batches, and one
whose attempts fail goes back to the small ones (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections import Counter

import pytest
from sqlalchemy import func, select

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks import deliverer
from groupbuy.webhooks.deliverer import CLAIM_ROUNDS, MAX_CLAIM, Deliverer
from groupbuy.webhooks.models import DeliveryRow
from groupbuy.webhooks.sender import Sender
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.receiver import Receiver
from tests.support.webhooks import feed, team_event


async def attempted(db: Database) -> int:
    """Deliveries attempted at least once."""
    async with db.sessions() as session:
        found = await session.scalar(select(func.count()).where(DeliveryRow.tries > 0))
        return int(found or 0)


async def one_pass(hooks: WebhookService) -> int:
    started = await hooks.deliverer.tick()
    await hooks.deliverer.settle()
    return started


FAST_CLAIM_ROUNDS = 12  # the product's is larger; the mechanism is the same, the test shorter


async def test_claims_grow_after_successes_and_shrink_after_failures(
    db: Database, hooks: WebhookService, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deliverer, "FAST_CLAIM_ROUNDS", FAST_CLAIM_ROUNDS)
    round_size = hooks.settings.max_in_flight
    await hooks.create(EndpointSpec("shop", receiver.url, ("*",)))
    events = (2 * CLAIM_ROUNDS + FAST_CLAIM_ROUNDS) * round_size + 8  # more than three passes
    await feed(db, *[team_event("team.opened", f"t{n}", 1) for n in range(events)])
    assert hooks.deliverer.claim_rounds("shop") == CLAIM_ROUNDS
    assert await one_pass(hooks) == CLAIM_ROUNDS * round_size
    assert hooks.deliverer.claim_rounds("shop") == FAST_CLAIM_ROUNDS
    assert await one_pass(hooks) == FAST_CLAIM_ROUNDS * round_size
    assert await attempted(db) == (CLAIM_ROUNDS + FAST_CLAIM_ROUNDS) * round_size
    receiver.answer_with(default="500")
    await one_pass(hooks)
    assert hooks.deliverer.claim_rounds("shop") == CLAIM_ROUNDS


async def test_a_claim_takes_at_most_max_claim_deliveries(db: Database) -> None:
    """However large max_in_flight is, one pass claims (and later records) a bounded number
    of deliveries: it does so while it holds SQLite's write lock."""
    settings = WebhookSettings(allow_http=True, allow_private_networks=True, max_in_flight=256)
    sender = Sender(settings.timeout_s, settings.max_in_flight, True)
    worker = Deliverer(db, settings, sender)
    try:
        assert worker._wanted("shop", Counter()) == CLAIM_ROUNDS * 256
        worker._fast.add("shop")
        assert worker._wanted("shop", Counter()) == MAX_CLAIM
    finally:
        await worker.stop()
