"""The viewer role (every GET, nothing else) and the audit log (every state-changing admin
route writes one entry per action it runs, read through GET /v1/admin/audit), iterating the route
table so that a new route is covered the day it is added."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from groupbuy_client import wire
from starlette.testclient import TestClient

from groupbuy.api import answers
from groupbuy.api.access import fingerprint
from groupbuy.api.app import ENDPOINTS, create_app
from groupbuy.api.endpoints import Endpoint
from groupbuy.errors import DatabaseUnavailable
from groupbuy.settings import Settings
from tests.support.http import (
    ADMIN,
    ADMIN_KEY,
    SERVICE,
    VIEWER,
    VIEWER_KEY,
    app_services,
    assert_ok,
    assert_problem,
)
from tests.support.receiver import Receiver, running_receiver

AUDIT = "/v1/admin/audit"
KEYED = [e for e in ENDPOINTS if e.role is not None]
READS = [e for e in KEYED if e.method == "GET"]
WRITES = [e for e in KEYED if e.method != "GET"]
# A path's parameters filled in: ids, and a job's name.
FILL = {"name": "sweep_locks"}
FINGERPRINT_SECRET = "fingerprint-secret-of-the-audit-tests"


def _path(endpoint: Endpoint) -> str:
    return re.sub(r"{(\w+)}", lambda m: FILL.get(m.group(1), "x1"), endpoint.path)


def _label(endpoint: Endpoint) -> str:
    return f"{endpoint.method} {endpoint.path}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from running_receiver()


@pytest.fixture
def local_client(settings: Settings) -> Iterator[TestClient]:
    """The API with webhooks allowed to a loopback receiver over plain HTTP."""
    local = settings.replace("webhooks", allow_http=True, allow_private_networks=True).replace(
        "auth", fingerprint_secret=FINGERPRINT_SECRET
    )
    with TestClient(create_app(local)) as client:
        yield client


def audit_entries(client: TestClient, limit: int = 100) -> list[dict[str, Any]]:
    """Every audit entry, newest first, read a page at a time."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        query: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        page = assert_ok(client.get(AUDIT, params=query, headers=ADMIN), 200)
        answers.validate(wire.AuditPage, page)
        found += page["entries"]
        cursor = page["next_cursor"]
        if cursor is None:
            return found


def test_viewer_reads_every_get_as_an_admin_does(client: TestClient) -> None:
    assert READS and any(e.role == "admin" for e in READS)
    for endpoint in READS:
        path = _path(endpoint)
        as_admin = client.get(path, headers=ADMIN)
        as_viewer = client.get(path, headers=VIEWER)
        assert as_viewer.status_code == as_admin.status_code, (_label(endpoint), as_viewer.text)
        assert as_viewer.status_code not in (401, 403) and as_viewer.status_code < 500


def test_viewer_is_refused_every_other_route_and_nothing_changes(client: TestClient) -> None:
    assert WRITES
    for endpoint in WRITES:
        response = client.request(endpoint.method, _path(endpoint), json={}, headers=VIEWER)
        body = assert_problem(response, 403, "forbidden")
        assert "viewer" in body["detail"], body
    assert audit_entries(client) == []
    assert assert_ok(client.get("/v1/accounts/x1", headers=VIEWER), 200)["balance_cents"] == 0
    assert_problem(client.get("/v1/activities/x1", headers=VIEWER), 404, "activity_not_found")


def test_the_openapi_document_names_the_roles_of_each_operation(client: TestClient) -> None:
    doc = assert_ok(client.get("/openapi.json"), 200)
    for endpoint in KEYED:
        operation = doc["paths"][endpoint.path][endpoint.method.lower()]
        roles = operation["x-roles"]
        assert "admin" in roles and ("viewer" in roles) == (endpoint.method == "GET")
        assert ("service" in roles) == (endpoint.role == "service"), _label(endpoint)
        assert ("403" in operation["responses"]) == (len(roles) < 3), _label(endpoint)
        assert operation.get("x-audit") == endpoint.audit


def test_every_state_changing_admin_route_is_audited() -> None:
    unaudited = [_label(e) for e in WRITES if e.role == "admin" and e.audit is None]
    assert unaudited == []
    assert all(e.audit is None for e in KEYED if e.method == "GET" or e.role != "admin")


def test_audit_rows_for_each_audited_route(local_client: TestClient, receiver: Receiver) -> None:
    c = local_client
    hook = {"endpoint_id": "shop", "url": receiver.url, "event_types": ["*"]}
    calls: list[tuple[str, str, dict[str, Any] | None, int, str, str, str | None]] = [
        ("POST", "/v1/activities", {"activity_id": "a1"}, 201, "activity.create", "a1", None),
        (
            "POST",
            "/v1/accounts/u1/deposits",
            {"amount_cents": 5, "reference": "r1"},
            201,
            "account.deposit",
            "u1",
            None,
        ),
        (
            "PUT",
            "/v1/admin/blocked-users/u2",
            {"reason": "fraud"},
            200,
            "user.block",
            "u2",
            "fraud",
        ),
        ("DELETE", "/v1/admin/blocked-users/u2", None, 200, "user.unblock", "u2", None),
        ("POST", "/v1/admin/jobs/flush_records/run", None, 200, "job.run", "flush_records", None),
        ("POST", "/v1/admin/webhooks", hook, 201, "webhook.create", "shop", None),
        (
            "PATCH",
            "/v1/admin/webhooks/shop",
            {"description": "d"},
            200,
            "webhook.update",
            "shop",
            None,
        ),
        (
            "POST",
            "/v1/admin/webhooks/shop/secret/rotate",
            None,
            200,
            "webhook.rotate_secret",
            "shop",
            None,
        ),
        ("POST", "/v1/admin/webhooks/shop/test", None, 200, "webhook.test", "shop", None),
        (
            "POST",
            "/v1/admin/webhooks/shop/replay",
            {"after": 0},
            202,
            "webhook.replay",
            "shop",
            None,
        ),
        ("DELETE", "/v1/admin/webhooks/shop", None, 200, "webhook.delete", "shop", None),
    ]
    for method, path, body, status, *_ in calls:
        assert_ok(c.request(method, path, json=body, headers=ADMIN), status)
    # Refused calls write nothing: a wrong role, a bad body, an unknown dead letter.
    assert_problem(c.put("/v1/admin/blocked-users/u3", json={}, headers=SERVICE), 403)
    assert_problem(c.post("/v1/activities", json={"activity_id": "a b"}, headers=ADMIN), 422)
    assert_problem(c.post("/v1/admin/dead-letters/9/replay", headers=ADMIN), 404)

    entries = audit_entries(c, limit=4)  # three pages
    expected = [(action, target, reason) for *_, action, target, reason in reversed(calls)]
    assert [(e["action"], e["target"], e["reason"]) for e in entries] == expected
    actor = f"admin:{fingerprint(ADMIN_KEY, FINGERPRINT_SECRET.encode())}"
    assert {e["actor"] for e in entries} == {actor}
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids)
    assert entries[0]["detail"] == {"method": "DELETE", "path": "/v1/admin/webhooks/shop"}
    # The log is the admins' and viewers' to read, and never holds a secret.
    page = c.get(AUDIT, headers=VIEWER)
    assert_ok(page, 200)
    assert ADMIN_KEY not in page.text and "whsec_" not in page.text
    assert VIEWER_KEY not in page.text
    assert_problem(c.get(AUDIT, headers=SERVICE), 403, "forbidden")
    assert_problem(c.get(AUDIT), 401, "unauthorized")


@pytest.mark.parametrize("query", [{"limit": 0}, {"limit": 101}, {"cursor": "x"}, {"a": "1"}])
def test_audit_bad_query_is_422(client: TestClient, query: dict[str, Any]) -> None:
    assert_problem(client.get(AUDIT, params=query, headers=ADMIN), 422, "invalid_request")


def test_an_action_whose_audit_entry_cannot_be_written_does_not_run(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry is written before the action: SQL refusing it leaves nothing done, rather
    than an action done and never audited."""

    async def refused(*_args: Any, **_kwargs: Any) -> dict[str, Any]:
        raise DatabaseUnavailable("the database is not answering")

    monkeypatch.setattr(app_services(client).audit, "record", refused)
    create = {"activity_id": "a1", "team_size": 3}
    assert_problem(client.post("/v1/activities", json=create, headers=ADMIN), 503)
    ran = client.post("/v1/admin/jobs/sweep_locks/run", headers=ADMIN)
    assert_problem(ran, 503)
    monkeypatch.undo()
    assert_problem(client.get("/v1/activities/a1", headers=ADMIN), 404, "activity_not_found")
    assert audit_entries(client) == []


def test_an_action_refused_after_its_entry_was_written_leaves_none(client: TestClient) -> None:
    assert_problem(client.post("/v1/admin/dead-letters/9/replay", headers=ADMIN), 404)
    assert_problem(
        client.patch("/v1/activities/nope", json={"status": "closed"}, headers=ADMIN), 404
    )
    assert audit_entries(client) == []
