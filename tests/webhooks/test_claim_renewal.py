"""Claims last one attempt timeout plus `claim_margin_s` and are renewed while held (SQLite
and PostgreSQL): a process that stops renewing (killed) leaves its deliveries to another
within that bound, and a live process keeps them past it, so none is attempted twice."""

from __future__ import annotations

from collections import Counter

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.receiver import Receiver, arrived
from tests.support.webhooks import FakeClock, feed, team_event

# One slot: the first delivery is attempted while the others wait for it, still claimed.
ONE_SLOT = WebhookSettings(
    allow_http=True,
    allow_private_networks=True,
    timeout_s=5.0,
    max_in_flight=1,
    claim_margin_s=10.0,
)


async def started(db: Database, receiver: Receiver, clock: FakeClock, events: int) -> None:
    await WebhookService(db, ONE_SLOT, clock=clock).store.create(
        EndpointSpec("shop", receiver.url, ("team.formed",))
    )
    await feed(db, *(team_event("team.formed", f"t{n}", 1) for n in range(events)))


async def test_a_killed_processes_claims_are_taken_over_after_timeout_plus_margin(
    db: Database, receiver: Receiver, clock: FakeClock
) -> None:
    receiver.answer_with("slow:2", default="200")
    await started(db, receiver, clock, 3)
    killed = WebhookService(db, ONE_SLOT, clock=clock)
    other = WebhookService(db, ONE_SLOT, clock=clock)
    try:
        assert killed.deliverer.claim_ms == 15_000  # timeout_s + claim_margin_s
        assert await killed.deliverer.tick() == 3  # four rounds of one slot: all three
        await arrived(receiver, 1)
        # From here `killed` passes no more (as if killed): its claims are not renewed.
        clock.advance(14)
        assert await other.deliverer.tick() == 0
        clock.advance(2)
        assert await other.deliverer.tick() == 3
        # The "killed" process's own attempts stop here: the one in flight ends under a
        # claim it no longer holds (its outcome changes nothing), the others are not made.
        await killed.deliverer.stop()
        await other.deliverer.settle()
    finally:
        await other.deliverer.stop()
        await killed.deliverer.stop()
    ok = Counter(r.headers["webhook-id"] for r in receiver.received if r.answer == "200")
    assert ok == {"evt_1": 1, "evt_2": 1, "evt_3": 1}


async def test_a_live_process_renews_its_claims_and_keeps_them_past_the_bound(
    db: Database, receiver: Receiver, clock: FakeClock
) -> None:
    receiver.answer_with("slow:2", default="200")
    await started(db, receiver, clock, 3)
    live = WebhookService(db, ONE_SLOT, clock=clock)
    other = WebhookService(db, ONE_SLOT, clock=clock)
    try:
        assert await live.deliverer.tick() == 3
        await arrived(receiver, 1)  # the first is in flight, two wait for its slot
        clock.advance(8)  # past a third of the claim's 15 s: this pass renews them
        await live.deliverer.tick()
        clock.advance(9)  # 17 s after the claim: it would have expired unrenewed
        assert await other.deliverer.tick() == 0
        await live.deliverer.settle()
    finally:
        await other.deliverer.stop()
        await live.deliverer.stop()
    attempts = Counter(r.headers["webhook-id"] for r in receiver.received)
    assert attempts == {"evt_1": 1, "evt_2": 1, "evt_3": 1}
