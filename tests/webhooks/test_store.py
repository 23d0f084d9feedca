"""Endpoints in SQL (SQLite and PostgreSQL): registration, idempotency, rotation, changes."""

from __future__ import annotations

import pytest

from groupbuy import errors
from groupbuy.settings import WebhookSettings
from groupbuy.storage.db import Database
from groupbuy.webhooks.service import WebhookService
from groupbuy.webhooks.store import EndpointSpec, secrets_in_use
from tests.support.webhooks import FakeClock, feed, team_event

SPEC = EndpointSpec("shop", "http://127.0.0.1:9/hook", ("team.formed",), "the shop", "feed")


async def test_a_registration_answers_the_secret_once(hooks: WebhookService) -> None:
    created = await hooks.create(SPEC)
    assert created.created and created.body["secret"].startswith("whsec_")
    again = await hooks.create(SPEC)
    assert not again.created and "secret" not in again.body
    assert again.body == {k: v for k, v in created.body.items() if k != "secret"}
    shown = await hooks.get("shop")
    assert "secret" not in shown and shown["event_types"] == ["team.formed"]
    listed = await hooks.page(None, 10)
    assert [e["endpoint_id"] for e in listed["webhooks"]] == ["shop"]
    assert all("secret" not in str(e.keys()) for e in listed["webhooks"])


async def test_the_same_id_with_other_parameters_conflicts(hooks: WebhookService) -> None:
    await hooks.create(SPEC)
    with pytest.raises(errors.Conflict):
        await hooks.create(EndpointSpec("shop", SPEC.url, ("*",)))


async def test_a_new_endpoint_starts_after_the_events_already_in_the_feed(
    db: Database, hooks: WebhookService
) -> None:
    await feed(db, team_event("team.formed", "t1", 3), team_event("team.formed", "t2", 3))
    created = await hooks.create(SPEC)
    assert created.body["position"] == 2


async def test_rotation_signs_with_both_secrets_until_the_overlap_ends(
    hooks: WebhookService, clock: FakeClock
) -> None:
    first = (await hooks.create(SPEC)).body["secret"]
    rotated = await hooks.rotate("shop")
    second = rotated["secret"]
    assert second != first
    row = await hooks.store.row("shop")
    assert secrets_in_use(row, clock()) == [second, first]
    clock.advance(WebhookSettings().secret_overlap_s + 1)
    assert secrets_in_use(row, clock()) == [second]


async def test_changes_and_deletion(hooks: WebhookService) -> None:
    await hooks.create(SPEC)
    changed = await hooks.update(
        "shop", {"url": "http://127.0.0.1:10/other", "disabled": True, "event_types": ["*"]}
    )
    assert changed["url"].endswith("/other") and changed["disabled"]
    assert changed["disabled_reason"] == "admin" and changed["event_types"] == ["*"]
    enabled = await hooks.update("shop", {"disabled": False})
    assert not enabled["disabled"] and enabled["disabled_reason"] is None
    assert await hooks.delete("shop") == {"endpoint_id": "shop", "deleted": True}
    with pytest.raises(errors.EndpointNotFound):
        await hooks.get("shop")


async def test_urls_are_checked_at_registration_and_on_change(db: Database) -> None:
    strict = WebhookService(db, WebhookSettings())
    with pytest.raises(errors.InvalidRequest, match="https://"):
        await strict.create(EndpointSpec("a", "http://shop.example/", ("*",)))
    with pytest.raises(errors.InvalidRequest, match="127.0.0.1"):
        await strict.create(EndpointSpec("a", "https://127.0.0.1/", ("*",)))
    lax = WebhookService(db, WebhookSettings(allow_http=True, allow_private_networks=True))
    await lax.create(EndpointSpec("a", "http://127.0.0.1/", ("*",)))
    with pytest.raises(errors.InvalidRequest):
        await strict.update("a", {"url": "https://10.0.0.1/"})
