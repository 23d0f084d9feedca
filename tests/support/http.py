"""Talking to the API in tests: the keys, the problem+json and JSON assertions, the portal."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx2 as httpx
from anyio.from_thread import BlockingPortal
from starlette.testclient import TestClient

from groupbuy.services import Services

T = TypeVar("T")

ADMIN_KEY = "admin-secret-for-tests"
SERVICE_KEY = "service-secret-for-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SERVICE = {"Authorization": f"Bearer {SERVICE_KEY}"}
API_KEYS = f"admin:{ADMIN_KEY},service:{SERVICE_KEY}"

ISO_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def ms(stamp: str) -> int:
    """Epoch milliseconds of an ISO-8601 UTC stamp with milliseconds (asserting the format)."""
    assert isinstance(stamp, str) and ISO_MS.match(stamp), stamp
    moment = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def assert_problem(response: httpx.Response, status: int, code: str | None = None) -> Any:
    """An RFC 9457 problem with this status (and, when given, this stable code); its body."""
    assert response.status_code == status, (
        response.request.url,
        response.status_code,
        response.text,
    )
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body = response.json()
    assert {"type", "title", "status", "code", "detail"} <= set(body), body
    assert body["status"] == status, body
    assert isinstance(body["code"], str) and re.fullmatch(r"[a-z][a-z0-9_]*", body["code"]), body
    if code is not None:
        assert body["code"] == code, body
    assert all(isinstance(body[k], str) and body[k] for k in ("type", "title", "detail")), body
    return body


def assert_ok(response: httpx.Response, status: int) -> Any:
    """A JSON answer with this status; its body."""
    assert response.status_code == status, (
        response.request.url,
        response.status_code,
        response.text,
    )
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return response.json()


def services_of(client: TestClient) -> Services:
    """The services behind a TestClient's app."""
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    return services


def portal(client: TestClient) -> BlockingPortal:
    """The portal into the event loop of a running TestClient (inside its `with`)."""
    assert client.portal is not None, "use the TestClient as a context manager"
    return client.portal


def on_loop(client: TestClient, call: Callable[..., Any], *args: Any) -> Any:
    """Run an async call of the app's services on the app's own event loop."""
    return portal(client).call(call, *args)
