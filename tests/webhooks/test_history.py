"""The admin's read of deliveries (SQLite and PostgreSQL): a page of deliveries shows each
one's newest attempts only, and a delivery's attempts are read a page at a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from groupbuy_client import wire
from groupbuy_client.wire import ATTEMPTS_SHOWN
from sqlalchemy import event
from starlette.testclient import TestClient

from groupbuy import errors
from groupbuy.api import answers
from groupbuy.api.app import create_app
from groupbuy.settings import Settings
from groupbuy.storage.db import Database
from groupbuy.webhooks.models import AttemptRow
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec
from tests.support.http import ADMIN, assert_ok, assert_problem
from tests.support.webhooks import delivery_tried

SPEC = EndpointSpec("shop", "http://127.0.0.1:9/hook", ("*",))
HOOKS = "/v1/admin/webhooks"


def statuses(attempts: list[dict[str, Any]]) -> list[int]:
    return [attempt["status_code"] for attempt in attempts]


@pytest.fixture
def loaded_attempts() -> Iterator[list[int]]:
    """The ids of the attempt rows the ORM builds while the test runs."""
    loaded: list[int] = []

    def on_load(target: AttemptRow, _context: Any) -> None:
        loaded.append(target.id)

    event.listen(AttemptRow, "load", on_load)
    try:
        yield loaded
    finally:
        event.remove(AttemptRow, "load", on_load)


async def test_a_page_shows_each_deliverys_newest_attempts_and_reads_no_more(
    db: Database, hooks: WebhookService, loaded_attempts: list[int]
) -> None:
    """A delivery retried for days has many attempts: the page carries its newest ten,
    their total and a cursor to the rest; the database sends only those ten."""
    await hooks.create(SPEC)
    await delivery_tried(db, "shop", 1, 25)
    await delivery_tried(db, "shop", 2, 3)
    page = await hooks.deliveries("shop", None, None, 10)
    many, few = sorted(page["deliveries"], key=lambda d: d["event_id"])
    assert statuses(many["attempts"]) == list(range(515, 525))  # the newest, oldest first
    assert many["attempts_total"] == 25 and many["older_attempts_cursor"] is not None
    assert statuses(few["attempts"]) == [500, 501, 502]
    assert (few["attempts_total"], few["older_attempts_cursor"]) == (3, None)
    assert len(loaded_attempts) == ATTEMPTS_SHOWN + 3


async def test_a_deliverys_attempts_are_read_newest_first_a_page_at_a_time(
    db: Database, hooks: WebhookService
) -> None:
    await hooks.create(SPEC)
    await delivery_tried(db, "shop", 1, 25)
    [delivery] = (await hooks.deliveries("shop", None, None, 10))["deliveries"]
    older: list[int] = []
    cursor = delivery["older_attempts_cursor"]
    while cursor is not None:
        page = await hooks.attempts("shop", "evt_1", cursor, 4)
        assert len(page["attempts"]) <= 4 and page["webhook_id"] == "evt_1"
        older += statuses(page["attempts"])
        cursor = page["next_cursor"]
    assert older == list(range(514, 499, -1))  # the 15 before the ten shown, newest first
    every = await hooks.attempts("shop", "evt_1", None, 100)
    assert statuses(every["attempts"]) == list(range(524, 499, -1))
    assert every["next_cursor"] is None


@pytest.mark.parametrize("webhook_id", ["evt_2", "evt_01", "test_abc", "evt_", "evt_x", "1"])
async def test_attempts_of_no_such_delivery_are_not_found(
    db: Database, hooks: WebhookService, webhook_id: str
) -> None:
    await hooks.create(SPEC)
    await delivery_tried(db, "shop", 1, 2)
    with pytest.raises(errors.DeliveryNotFound):
        await hooks.attempts("shop", webhook_id, None, 10)


async def test_another_endpoints_delivery_is_not_found(db: Database, hooks: WebhookService) -> None:
    await hooks.create(SPEC)
    await hooks.create(EndpointSpec("other", SPEC.url, ("*",)))
    await delivery_tried(db, "other", 1, 2)
    with pytest.raises(errors.DeliveryNotFound):
        await hooks.attempts("shop", "evt_1", None, 10)
    with pytest.raises(errors.EndpointNotFound):
        await hooks.attempts("nope", "evt_1", None, 10)


@pytest.fixture
def admin_client(settings: Settings) -> Iterator[TestClient]:
    local = settings.replace("webhooks", allow_http=True, allow_private_networks=True)
    with TestClient(create_app(local)) as client:
        yield client


def test_the_attempts_route(admin_client: TestClient) -> None:
    c = admin_client
    body = {"endpoint_id": "shop", "url": SPEC.url, "event_types": ["*"]}
    assert_ok(c.post(HOOKS, json=body, headers=ADMIN), 201)
    database = c.app.state.services.database  # type: ignore[attr-defined]
    c.portal.call(delivery_tried, database, "shop", 1, 12)  # type: ignore[union-attr]
    page = assert_ok(c.get(f"{HOOKS}/shop/deliveries", headers=ADMIN), 200)
    answers.validate(wire.WebhookDeliveriesPage, page)
    [delivery] = page["deliveries"]
    assert (len(delivery["attempts"]), delivery["attempts_total"]) == (10, 12)
    rest = f"{HOOKS}/shop/deliveries/evt_1/attempts"
    older = assert_ok(
        c.get(rest, params={"cursor": delivery["older_attempts_cursor"]}, headers=ADMIN), 200
    )
    answers.validate(wire.WebhookAttemptsPage, older)
    assert statuses(older["attempts"]) == [501, 500] and older["next_cursor"] is None
    first = assert_ok(c.get(rest, params={"limit": 1}, headers=ADMIN), 200)
    assert statuses(first["attempts"]) == [511] and first["next_cursor"]
    assert_problem(
        c.get(f"{HOOKS}/shop/deliveries/evt_9/attempts", headers=ADMIN), 404, "delivery_not_found"
    )
    assert_problem(
        c.get(f"{HOOKS}/nope/deliveries/evt_1/attempts", headers=ADMIN), 404, "endpoint_not_found"
    )
    assert_problem(c.get(rest, params={"cursor": "x"}, headers=ADMIN), 422, "invalid_request")
    assert_problem(c.get(rest, params={"limit": 101}, headers=ADMIN), 422, "invalid_request")
