"""Fixtures of the webhook tests: a database (SQLite and PostgreSQL), a real receiver on
loopback, a clock the tests move, and the webhook service on them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks.service import WebhookService
from tests.support.receiver import Receiver, running_receiver
from tests.support.webhooks import FakeClock

# Loopback receivers over plain HTTP; short timeouts so a hang costs the test little.
TEST_WEBHOOKS = WebhookSettings(
    allow_http=True, allow_private_networks=True, timeout_s=1.0, max_in_flight=4
)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from running_receiver()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def hooks(db: Database, clock: FakeClock) -> AsyncIterator[WebhookService]:
    service = WebhookService(db, TEST_WEBHOOKS, clock=clock)
    try:
        yield service
    finally:
        await service.deliverer.stop()
