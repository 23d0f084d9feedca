"""Secrets never reach the logs, even with every logger at DEBUG: not in SQLAlchemy's
statement lines, not in the driver's, not in an error's text (SQLite and PostgreSQL)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.receiver import Receiver, arrived
from tests.support.webhooks import FakeClock, feed, team_event

SETTINGS = WebhookSettings(allow_http=True, allow_private_networks=True, timeout_s=1.0)
# Turning DEBUG on: the root logger, and SQLAlchemy's statement logger named as well.
CHATTY = ("", "sqlalchemy.engine")


@pytest.fixture
def everything_at_debug(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger that might say a statement's parameters at DEBUG, captured."""
    caplog.set_level(logging.DEBUG)
    before = {name: logging.getLogger(name).level for name in CHATTY}
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield caplog
    finally:
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the records say, tracebacks included."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    return "\n".join(handler.format(record) for record in caplog.records)


async def test_no_secret_is_logged_at_debug(
    database_url: str,
    receiver: Receiver,
    clock: FakeClock,
    everything_at_debug: pytest.LogCaptureFixture,
) -> None:
    # The engine is made after the levels are set: SQLAlchemy reads them per connection.
    db = Database(database_url)
    hooks = WebhookService(db, SETTINGS, clock=clock)
    try:
        first = (await hooks.create(EndpointSpec("shop", receiver.url, ("*",)))).body["secret"]
        second = (await hooks.rotate("shop"))["secret"]
        await feed(db, team_event("team.formed", "t1", 3))
        await hooks.deliverer.tick()
        await hooks.deliverer.settle()
        assert len(await arrived(receiver, 1)) == 1
        # An error whose text would carry the statement's parameters: a taken primary key
        # (the database's own detail names the key only).
        with pytest.raises(Exception) as raised:
            async with db.transaction() as session:
                await session.execute(
                    text(
                        "INSERT INTO webhook_endpoints (endpoint_id, url, event_types, "
                        "ordering, disabled, secret, position, created_ms) "
                        "VALUES ('shop', 'http://x', '[]', 'feed', false, :secret, 0, 0)"
                    ),
                    {"secret": second},
                )
        logging.getLogger("groupbuy.test").exception("failed", exc_info=raised.value)
    finally:
        await hooks.deliverer.stop()
        await db.dispose()
    said = logged(everything_at_debug)
    assert "INSERT INTO webhook_endpoints" in said  # the statements themselves are logged
    for secret in (first, second):
        assert secret not in said
        assert secret.removeprefix("whsec_") not in said
