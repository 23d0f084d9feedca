"""A console form is checked by the rules of the API call it stands for (SPEC §3 Console):
the same reason rules as PUT /v1/admin/blocked-users, the API's id rule in every address,
and a refused form changes nothing: not SQL, not Redis, not the audit log. On SQLite and
PostgreSQL (the suite's `database` parameter)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.support.console import form_of, sign_in
from tests.support.http import ADMIN, ADMIN_KEY, app_services, assert_ok, assert_problem, portal

BAD_REASONS = {
    "nul": "spam\x00bot",
    "too long": "r" * 501,
}


def _state(client: TestClient, uid: str) -> tuple[Any, Any, list[dict[str, Any]]]:
    """What SQL lists, what Redis's copy holds for `uid`, and the audit log."""
    services = app_services(client)
    listed = assert_ok(client.get("/v1/admin/blocked-users", headers=ADMIN), 200)
    in_redis = portal(client).call(services.redis.hget, services.keys.blocked_users(), uid)
    audit = portal(client).call(services.audit.page, 100)["entries"]
    return listed["blocked_users"], in_redis, audit


@pytest.mark.parametrize("reason", list(BAD_REASONS.values()), ids=list(BAD_REASONS))
def test_a_console_block_with_a_reason_the_api_refuses_changes_nothing(
    client: TestClient, reason: str
) -> None:
    sign_in(client, ADMIN_KEY)
    form = form_of(client, "/console/blocked-users", user_id="u9", reason=reason)
    refused = client.post("/console/blocked-users", data=form)
    assert refused.status_code == 422, refused.text
    assert "reason" in refused.text
    assert _state(client, "u9") == ([], None, [])


@pytest.mark.parametrize("reason", list(BAD_REASONS.values()), ids=list(BAD_REASONS))
def test_an_api_block_with_such_a_reason_is_422_and_changes_nothing(
    client: TestClient, reason: str
) -> None:
    answer = client.put("/v1/admin/blocked-users/u9", json={"reason": reason}, headers=ADMIN)
    assert_problem(answer, 422, "invalid_request")
    assert _state(client, "u9") == ([], None, [])


@pytest.mark.parametrize("reason", list(BAD_REASONS.values()), ids=list(BAD_REASONS))
def test_every_action_refuses_such_a_reason_before_it_runs(client: TestClient, reason: str) -> None:
    sign_in(client, ADMIN_KEY)
    form = form_of(client, "/console/integrity", reason=reason)
    refused = client.post("/console/integrity/jobs/sweep_locks/run", data=form)
    assert refused.status_code == 422, refused.text
    assert _state(client, "u9")[2] == []


def test_the_longest_reason_the_api_takes_is_taken_and_audited_whole(client: TestClient) -> None:
    sign_in(client, ADMIN_KEY)
    reason = "é" * 500
    form = form_of(client, "/console/blocked-users", user_id="u9", reason=reason)
    assert client.post("/console/blocked-users", data=form, follow_redirects=False).status_code == (
        303
    )
    listed, in_redis, audit = _state(client, "u9")
    assert [(u["user_id"], u["reason"]) for u in listed] == [("u9", reason)]
    assert in_redis is not None and in_redis.endswith("|" + reason)
    assert [(e["action"], e["target"], e["reason"]) for e in audit] == [
        ("user.block", "u9", reason)
    ]


@pytest.mark.parametrize(
    ("path", "status"),
    [
        # In a path the router already finds no page (its `.*` stops at a newline).
        ("/console/activities/a1%0A", 404),
        ("/console/activities/a1/teams/t1%0A", 404),
        # In a query the console's checks refuse it, as the API's do.
        ("/console/redpackets?sender_id=s1%0A", 422),
        ("/console/live.json?page=activity&id=a1%0A", 400),
        ("/console/live.json?page=packets&sender_id=s1%0A", 400),
    ],
)
def test_an_id_with_a_trailing_newline_is_refused_as_the_api_refuses_it(
    client: TestClient, path: str, status: int
) -> None:
    sign_in(client, ADMIN_KEY)
    assert client.get(path).status_code == status, path


def test_an_action_on_an_id_with_a_trailing_newline_changes_nothing(client: TestClient) -> None:
    assert_ok(client.put("/v1/admin/blocked-users/u1", json={}, headers=ADMIN), 200)
    api = client.delete("/v1/admin/blocked-users/u1%0A", headers=ADMIN)
    assert_problem(api, 422, "invalid_request")
    sign_in(client, ADMIN_KEY)
    form = form_of(client, "/console/blocked-users")
    refused = client.post("/console/blocked-users/u1%0A/unblock", data=form)
    assert refused.status_code == 404, refused.text
    form = form_of(client, "/console/blocked-users", user_id="u2\nu3")
    assert client.post("/console/blocked-users", data=form).status_code == 422
    listed, in_redis, audit = _state(client, "u1")
    assert [u["user_id"] for u in listed] == ["u1"] and in_redis is not None
    assert [(e["action"], e["target"]) for e in audit] == [("user.block", "u1")]
