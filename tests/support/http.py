"""What the HTTP tests share: the API keys, the checks of an answer, the time format."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import httpx2 as httpx
from anyio.from_thread import BlockingPortal
from starlette.applications import Starlette
from starlette.testclient import TestClient

from groupbuy.services import Services

ADMIN_KEY = "admin-secret-for-tests"
SERVICE_KEY = "service-secret-for-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SERVICE = {"Authorization": f"Bearer {SERVICE_KEY}"}
VIEWER_KEY = "viewer-secret-for-tests"
VIEWER = {"Authorization": f"Bearer {VIEWER_KEY}"}

ISO_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
PROBLEM_CODE = re.compile(r"[a-z][a-z0-9_]*")


def ms(stamp: str) -> int:
    """Epoch milliseconds of an ISO-8601 UTC stamp with milliseconds (asserting the format)."""
    assert isinstance(stamp, str) and ISO_MS.match(stamp), stamp
    moment = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def assert_problem(response: httpx.Response, status: int, code: str | None = None) -> Any:
    """An RFC 9457 problem with this status (and this stable code, when given); returns the body."""
    assert response.status_code == status, (
        response.request.url,
        response.status_code,
        response.text,
    )
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body = response.json()
    assert {"type", "title", "status", "code", "detail"} <= set(body), body
    assert body["status"] == status, body
    assert isinstance(body["code"], str) and PROBLEM_CODE.fullmatch(body["code"]), body
    if code is not None:
        assert body["code"] == code, body
    assert all(isinstance(body[k], str) and body[k] for k in ("type", "title", "detail")), body
    return body


def assert_ok(response: httpx.Response, status: int) -> Any:
    """A JSON answer with this status; returns the body."""
    assert response.status_code == status, (
        response.request.url,
        response.status_code,
        response.text,
    )
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return response.json()


def portal(client: TestClient) -> BlockingPortal:
    """The portal into the app's event loop (there while the client's `with` block runs)."""
    assert client.portal is not None, "use the client inside its `with` block"
    return client.portal


def app_of(client: TestClient) -> Starlette:
    """The Starlette application the client drives."""
    assert isinstance(client.app, Starlette), client.app
    return client.app


def app_services(client: TestClient) -> Services:
    """The services the client's app built and runs (its lifespan started them)."""
    services = app_of(client).state.services
    assert isinstance(services, Services), services
    return services


def make_activity(client: TestClient, aid: str, **params: Any) -> Any:
    """Create an activity (201 Created); returns its body."""
    return assert_ok(
        client.post("/v1/activities", json={"activity_id": aid, **params}, headers=ADMIN), 201
    )


def open_team(
    client: TestClient, aid: str, tid: str | None, leader: str, order: str | None = None
) -> Any:
    """Open a team (201 Created), with a generated id when `tid` is None; returns the team."""
    body: dict[str, Any] = {"leader_id": leader}
    if tid is not None:
        body["team_id"] = tid
    if order is not None:
        body["order_id"] = order
    return assert_ok(client.post(f"/v1/activities/{aid}/teams", json=body, headers=SERVICE), 201)


def deposit(
    client: TestClient, uid: str, amount: Any, reference: Any, headers: dict[str, str] = ADMIN
) -> httpx.Response:
    """POST a deposit, whatever the answer (the amount and reference may be invalid on purpose)."""
    return client.post(
        f"/v1/accounts/{uid}/deposits",
        json={"amount_cents": amount, "reference": reference},
        headers=headers,
    )


def send(client: TestClient, **body: Any) -> httpx.Response:
    """POST a red packet with this body, whatever the answer."""
    return client.post("/v1/redpackets", json=body, headers=SERVICE)


def grab(client: TestClient, pid: str, uid: str) -> httpx.Response:
    """POST a grab of packet `pid` for user `uid`, whatever the answer."""
    return client.post(f"/v1/redpackets/{pid}/grab", json={"user_id": uid}, headers=SERVICE)


def grabbed(client: TestClient, pid: str, uid: str) -> int:
    """Grab a share that must be there; returns its amount."""
    body = assert_ok(grab(client, pid, uid), 200)
    assert set(body) == {"status", "amount_cents", "remaining_count"}, body
    assert body["status"] == "grabbed" and body["amount_cents"] >= 1, body
    return int(body["amount_cents"])


def lock(client: TestClient, aid: str, tid: str, uid: str) -> httpx.Response:
    """POST a seat lock of team `tid` for user `uid`, whatever the answer."""
    return client.post(
        f"/v1/activities/{aid}/teams/{tid}/locks", json={"user_id": uid}, headers=SERVICE
    )
