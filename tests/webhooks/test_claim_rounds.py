"""Claim sizes: an endpoint whose attempts succeed is claimed in larger batches, and one
whose attempts fail goes back to the small ones (SQLite and PostgreSQL)."""

from __future__ import annotations

from sqlalchemy import func, select

from groupbuy.storage.db import Database
from groupbuy.webhooks.deliverer import CLAIM_ROUNDS, FAST_CLAIM_ROUNDS
from groupbuy.webhooks.models import DeliveryRow
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


async def test_claims_grow_after_successes_and_shrink_after_failures(
    db: Database, hooks: WebhookService, receiver: Receiver
) -> None:
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
