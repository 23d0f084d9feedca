"""The admin API of webhooks end to end (SQLite and PostgreSQL): every route, its
documented answer shapes and problems, secrets shown once and never logged, URL checks,
and a delivery made by the deliverer the service runs."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from groupbuy_client import wire
from starlette.testclient import TestClient

from groupbuy.api import answers
from groupbuy.api.app import ENDPOINTS, create_app
from groupbuy.settings import Settings
from tests.support.http import ADMIN, SERVICE, assert_ok, assert_problem
from tests.support.receiver import Receiver
from tests.support.webhooks import verified

HOOKS = "/v1/admin/webhooks"


@pytest.fixture
def admin_client(settings: Settings) -> Iterator[TestClient]:
    local = settings.replace(
        "webhooks",
        allow_http=True,
        allow_private_networks=True,
        timeout_s=2.0,
        poll_interval_s=0.05,
    )
    with TestClient(create_app(local)) as client:
        yield client


def shaped(shape: object, body: Any) -> Any:
    """The body, validated against its documented answer shape."""
    return answers.validate(shape, body)


def test_every_webhook_route_is_in_the_openapi_document(admin_client: TestClient) -> None:
    doc = admin_client.get("/openapi.json").json()
    ours = {(e.method.lower(), e.path) for e in ENDPOINTS if e.path.startswith(HOOKS)}
    assert len(ours) == 10
    for method, path in ours:
        assert method in doc["paths"][path], (method, path)


def test_the_admin_api_end_to_end(
    admin_client: TestClient, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    # What the service logs as `groupbuy serve` configures it: INFO, ours down to DEBUG.
    # (aiosqlite at DEBUG logs every statement's parameters, secrets included.)
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="groupbuy")
    c = admin_client
    body = {"endpoint_id": "shop", "url": receiver.url, "event_types": ["packet.sent"]}
    assert_problem(c.post(HOOKS, json=body, headers=SERVICE), 403, "forbidden")
    created = shaped(
        wire.WebhookEndpointCreated, assert_ok(c.post(HOOKS, json=body, headers=ADMIN), 201)
    )
    secret = created["secret"]
    assert secret.startswith("whsec_")
    again = assert_ok(c.post(HOOKS, json=body, headers=ADMIN), 200)
    assert "secret" not in again
    other = {**body, "event_types": ["*"]}
    assert_problem(c.post(HOOKS, json=other, headers=ADMIN), 409, "conflict")
    listed = shaped(wire.WebhookEndpointsPage, assert_ok(c.get(HOOKS, headers=ADMIN), 200))
    assert [w["endpoint_id"] for w in listed["webhooks"]] == ["shop"]
    one = shaped(wire.WebhookEndpoint, assert_ok(c.get(f"{HOOKS}/shop", headers=ADMIN), 200))
    assert one["url"] == receiver.url and "secret" not in one
    assert_problem(c.get(f"{HOOKS}/nope", headers=ADMIN), 404, "endpoint_not_found")

    # the test ping
    ping = shaped(
        wire.WebhookTestAttempt, assert_ok(c.post(f"{HOOKS}/shop/test", headers=ADMIN), 200)
    )
    assert ping["status_code"] == 200 and ping["webhook_id"].startswith("test_")
    assert verified(secret, receiver.wait_for(1)[0])["type"] == "webhook.test"

    # a delivery by the deliverer the service runs
    c.post(
        "/v1/accounts/alice/deposits", json={"amount_cents": 900, "reference": "r1"}, headers=ADMIN
    )
    packet = {"sender_id": "alice", "amount_cents": 500, "count": 2, "packet_id": "pk1"}
    assert_ok(c.post("/v1/redpackets", json=packet, headers=SERVICE), 201)
    got = receiver.wait_for(2)[1]
    sent = verified(secret, got)
    assert sent["type"] == "packet.sent" and sent["data"]["data"]["packet_id"] == "pk1"
    deadline = time.monotonic() + 10
    while True:
        page = assert_ok(c.get(f"{HOOKS}/shop/deliveries", headers=ADMIN), 200)
        if page["deliveries"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    shaped(wire.WebhookDeliveriesPage, page)
    [delivery] = page["deliveries"]
    assert delivery["webhook_id"] == got.headers["webhook-id"]
    assert delivery["status"] == "delivered" and delivery["attempts"][0]["status_code"] == 200
    failed = assert_ok(c.get(f"{HOOKS}/shop/deliveries?status=failed", headers=ADMIN), 200)
    assert failed["deliveries"] == []
    assert_problem(c.get(f"{HOOKS}/shop/deliveries?cursor=x", headers=ADMIN), 422)

    # replay: the same webhook-id again
    queued = c.post(f"{HOOKS}/shop/replay", json={"after": 0}, headers=ADMIN)
    shaped(wire.WebhookReplayQueued, assert_ok(queued, 202))
    assert queued.json()["queued"] == 1
    again_got = receiver.wait_for(3)[2]
    assert again_got.headers["webhook-id"] == got.headers["webhook-id"]
    assert_problem(
        c.post(f"{HOOKS}/shop/replay", json={"after": 5, "until": 2}, headers=ADMIN), 422
    )

    # rotation: the new secret is shown once; both sign
    rotated = shaped(
        wire.WebhookSecretRotated,
        assert_ok(c.post(f"{HOOKS}/shop/secret/rotate", headers=ADMIN), 200),
    )
    new_secret = rotated["secret"]
    ping = assert_ok(c.post(f"{HOOKS}/shop/test", headers=ADMIN), 200)
    signed = receiver.wait_for(4)[3]
    assert len(signed.headers["webhook-signature"].split()) == 2
    verified(secret, signed)
    verified(new_secret, signed)

    # changes
    patched = c.patch(
        f"{HOOKS}/shop", json={"disabled": True, "description": "paused"}, headers=ADMIN
    )
    changed = shaped(wire.WebhookEndpoint, assert_ok(patched, 200))
    assert changed["disabled"] and changed["disabled_reason"] == "admin"
    assert_problem(c.patch(f"{HOOKS}/shop", json={"url": None}, headers=ADMIN), 422)
    assert_problem(c.patch(f"{HOOKS}/shop", json={"url": "ftp://x/"}, headers=ADMIN), 422)
    deleted = shaped(wire.WebhookDeleted, assert_ok(c.delete(f"{HOOKS}/shop", headers=ADMIN), 200))
    assert deleted == {"endpoint_id": "shop", "deleted": True}
    assert_problem(c.delete(f"{HOOKS}/shop", headers=ADMIN), 404, "endpoint_not_found")

    logged = "\n".join(r.getMessage() for r in caplog.records)
    for shown in (secret, new_secret):
        assert shown not in logged
        assert shown.removeprefix("whsec_") not in logged


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("http://shop.example/hooks", "https://"),
        ("https://127.0.0.1/hooks", "127.0.0.1"),
        ("https://10.0.0.8/hooks", "10.0.0.8"),
        ("https://[::1]/hooks", "::1"),
        ("https://user:pw@shop.example/", "credentials"),
        ("not a url", "https://"),
    ],
)
def test_urls_that_are_not_allowed_are_422(client: TestClient, url: str, detail: str) -> None:
    body = {"endpoint_id": "shop", "url": url, "event_types": ["*"]}
    problem = assert_problem(client.post(HOOKS, json=body, headers=ADMIN), 422, "invalid_request")
    assert detail in problem["detail"]
    assert re.search(r"url", problem["detail"])


@pytest.mark.parametrize(
    "body",
    [
        {"endpoint_id": "shop", "url": "https://x.example/", "event_types": []},
        {"endpoint_id": "shop", "url": "https://x.example/", "event_types": ["Team Formed"]},
        {"endpoint_id": "sh op", "url": "https://x.example/", "event_types": ["*"]},
        {"endpoint_id": "shop", "url": "https://x.example/", "event_types": ["*"], "ordering": "x"},
        {"endpoint_id": "shop", "url": "https://x.example/", "event_types": ["*"], "secret": "s"},
    ],
)
def test_bad_bodies_are_422(client: TestClient, body: dict[str, Any]) -> None:
    assert_problem(client.post(HOOKS, json=body, headers=ADMIN), 422, "invalid_request")


def test_a_misspelt_event_type_is_refused_where_it_would_never_deliver(
    admin_client: TestClient, receiver: Receiver
) -> None:
    """A type outside the registry is a 422 naming it, on create and on change; nothing is
    stored."""
    client = admin_client
    body = {"endpoint_id": "shop", "url": receiver.url, "event_types": ["team.fromed"]}
    problem = assert_problem(client.post(HOOKS, json=body, headers=ADMIN), 422, "invalid_request")
    assert "team.fromed" in problem["detail"]
    assert client.get(f"{HOOKS}/shop", headers=ADMIN).status_code == 404
    created = client.post(HOOKS, json={**body, "event_types": ["team.formed"]}, headers=ADMIN)
    assert created.status_code == 201, created.text
    changed = client.patch(f"{HOOKS}/shop", json={"event_types": ["lock.expird"]}, headers=ADMIN)
    assert_problem(changed, 422, "invalid_request")
    assert client.get(f"{HOOKS}/shop", headers=ADMIN).json()["event_types"] == ["team.formed"]
