"""Events committed in this process wake the deliverer at once (SQLite and PostgreSQL):
the commit, not the poll, starts the pass that delivers them."""

from __future__ import annotations

import asyncio
import time

import pytest

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.storage.events import FEED_COMMITTED, Event, record_events
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.receiver import Receiver, arrived
from tests.support.webhooks import feed, team_event

# A poll this long never comes within the test: only a wake can start the second pass.
SLOW_POLL = WebhookSettings(
    allow_http=True, allow_private_networks=True, timeout_s=1.0, poll_interval_s=60
)


async def until_idle(hooks: WebhookService, passes: int) -> None:
    deadline = time.monotonic() + 10
    while hooks.deliverer.passes < passes:
        assert time.monotonic() < deadline, "the deliverer's first pass did not end"
        await asyncio.sleep(0.01)


async def test_an_event_committed_here_is_delivered_without_waiting_for_the_poll(
    db: Database, receiver: Receiver
) -> None:
    hooks = WebhookService(db, SLOW_POLL)
    await hooks.create(EndpointSpec("shop", receiver.url, ("*",)))
    hooks.start_delivering()
    try:
        await until_idle(hooks, 1)  # found nothing; the next poll is a minute away
        await feed(db, team_event("team.formed", "t1", 3))
        [delivery] = await arrived(receiver, 1, timeout_s=10)
        assert delivery.headers["webhook-id"] == "evt_1"
    finally:
        await hooks.stop_delivering()


async def test_the_service_listens_while_it_delivers_only(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = WebhookService(db, SLOW_POLL)
    woken: list[str] = []
    monkeypatch.setattr(hooks.deliverer, "wake", lambda: woken.append("woken"))
    await feed(db, team_event("team.opened", "t1", 1))
    assert woken == []  # not delivering yet
    hooks.start_delivering()
    try:
        await feed(db, team_event("team.formed", "t1", 3))
        assert woken == ["woken"]
    finally:
        await hooks.stop_delivering()
    await feed(db, team_event("team.failed", "t2", 2))
    assert woken == ["woken"]


async def test_listeners_run_after_commits_of_events_only(db: Database) -> None:
    calls: list[int] = []

    def listener() -> None:
        calls.append(1)

    db.on_commit(FEED_COMMITTED, listener)
    event = Event("team.formed", 1, "k1", {"team_id": "t1"})
    async with db.transaction() as session:
        await record_events(session, [event])
        assert calls == []  # not before the commit
    assert calls == [1]
    async with db.transaction():
        pass  # no event recorded: nothing to wake
    assert calls == [1]
    with pytest.raises(RuntimeError):
        async with db.transaction() as session:
            await record_events(session, [Event("team.formed", 2, "k2", {"team_id": "t2"})])
            raise RuntimeError("rolled back")
    assert calls == [1]
    db.off_commit(FEED_COMMITTED, listener)
    async with db.transaction() as session:
        await record_events(session, [Event("team.formed", 3, "k3", {"team_id": "t3"})])
    assert calls == [1]
