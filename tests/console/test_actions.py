"""The console's actions: admins only, each with the session's CSRF token, a reason and a
confirmation, and each written to the audit log with that reason."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.support.console import (
    VIEWER_KEY,
    action_forms,
    assert_no_inline_script,
    assert_secure_headers,
    csrf_of,
    form_of,
    parts_of,
    sign_in,
)
from tests.support.http import ADMIN, ADMIN_KEY, assert_ok

ENDPOINT = {"endpoint_id": "e1", "url": "http://127.0.0.1:9/hook", "event_types": ["*"]}
# (page the form is on, where it posts, extra fields, audit action, audit target)
ACTIONS = [
    ("/console/integrity", "/console/integrity/jobs/sweep_locks/run", {}, "job.run", "sweep_locks"),
    ("/console/blocked-users", "/console/blocked-users", {"user_id": "u9"}, "user.block", "u9"),
    (
        "/console/blocked-users",
        "/console/blocked-users/bad1/unblock",
        {},
        "user.unblock",
        "bad1",
    ),
    ("/console/webhooks", "/console/webhooks/e1/disable", {}, "webhook.disable", "e1"),
    ("/console/webhooks", "/console/webhooks/e1/enable", {}, "webhook.enable", "e1"),
    ("/console/webhooks/e1", "/console/webhooks/e1/test", {}, "webhook.test", "e1"),
    (
        "/console/webhooks/e1",
        "/console/webhooks/e1/replay",
        {"after": "0", "until": "5"},
        "webhook.replay",
        "e1",
    ),
]


@pytest.fixture
def prepared(client: TestClient) -> TestClient:
    """An endpoint and a blocked user to act on."""
    assert_ok(client.post("/v1/admin/webhooks", json=ENDPOINT, headers=ADMIN), 201)
    assert_ok(client.put("/v1/admin/blocked-users/bad1", json={}, headers=ADMIN), 200)
    return client


# The fixture's set-up goes through the admin API, which audits it too: not the console's.
_SET_UP = {("webhook.create", "e1"), ("user.block", "bad1")}


def _audit(client: TestClient) -> list[dict[str, Any]]:
    """The audit entries of the console's actions, newest first."""
    services = client.app.state.services  # type: ignore[attr-defined]
    page: dict[str, Any] = client.portal.call(services.audit.page, 100)  # type: ignore[union-attr]
    return [e for e in page["entries"] if (e["action"], e["target"]) not in _SET_UP]


@pytest.mark.parametrize(("page", "target", "extra", "action", "subject"), ACTIONS)
def test_an_action_runs_and_is_audited_with_its_reason(
    prepared: TestClient,
    page: str,
    target: str,
    extra: dict[str, str],
    action: str,
    subject: str,
) -> None:
    sign_in(prepared, ADMIN_KEY)
    form = form_of(prepared, page, reason=f"because of {action}", **extra)
    done = prepared.post(target, data=form, follow_redirects=False)
    assert done.status_code == 303, done.text
    assert_secure_headers(done)
    entries = _audit(prepared)
    assert len(entries) == 1, entries
    entry = entries[0]
    assert entry["action"] == action and entry["target"] == subject
    assert entry["reason"] == f"because of {action}"
    assert entry["actor"].startswith("admin:") and ADMIN_KEY not in entry["actor"]
    back = prepared.get(done.headers["location"])
    assert f"{action} {subject}: done" in back.text
    shown = prepared.get("/console/audit")
    assert f"because of {action}" in shown.text


def test_the_actions_change_what_they_say(prepared: TestClient) -> None:
    sign_in(prepared, ADMIN_KEY)
    page = "/console/blocked-users"
    prepared.post(page, data=form_of(prepared, page, user_id="u9"))
    listed = assert_ok(prepared.get("/v1/admin/blocked-users", headers=ADMIN), 200)
    assert {user["user_id"] for user in listed["blocked_users"]} == {"bad1", "u9"}
    prepared.post("/console/webhooks/e1/disable", data=form_of(prepared, "/console/webhooks"))
    assert assert_ok(prepared.get("/v1/admin/webhooks/e1", headers=ADMIN), 200)["disabled"]
    prepared.post("/console/webhooks/e1/enable", data=form_of(prepared, "/console/webhooks"))
    assert not assert_ok(prepared.get("/v1/admin/webhooks/e1", headers=ADMIN), 200)["disabled"]


def test_a_refused_action_is_audited_with_why(prepared: TestClient) -> None:
    sign_in(prepared, ADMIN_KEY)
    form = form_of(prepared, "/console/integrity")
    refused = prepared.post("/console/integrity/dead-letters/999/replay", data=form)
    assert refused.status_code == 404
    assert_no_inline_script(refused.text)
    [entry] = _audit(prepared)
    assert entry["action"] == "dead_letter.replay" and entry["target"] == "999"
    assert entry["detail"]["error"] == "not_found"


@pytest.mark.parametrize(
    ("target", "extra", "status"),
    [
        ("/console/integrity/jobs/no_such_job/run", {}, 404),
        ("/console/blocked-users", {"user_id": "bad id!"}, 422),
        ("/console/blocked-users", {}, 422),
        ("/console/webhooks/e1/replay", {}, 422),
        ("/console/webhooks/e1/replay", {"after": "5", "until": "4"}, 422),
        ("/console/webhooks/e1/replay", {"after": "x"}, 422),
        ("/console/webhooks/nope/test", {}, 404),
    ],
)
def test_a_bad_action_answers_4xx_and_changes_nothing(
    prepared: TestClient, target: str, extra: dict[str, str], status: int
) -> None:
    sign_in(prepared, ADMIN_KEY)
    answer = prepared.post(target, data=form_of(prepared, "/console/integrity", **extra))
    assert answer.status_code == status, answer.text
    assert_secure_headers(answer)
    listed = assert_ok(prepared.get("/v1/admin/blocked-users", headers=ADMIN), 200)
    assert [user["user_id"] for user in listed["blocked_users"]] == ["bad1"]


@pytest.mark.parametrize(
    "change",
    [
        {"reason": ""},
        {"reason": "   "},
        {"confirm": ""},
        {"confirm": "no"},
    ],
)
def test_an_action_needs_a_reason_and_the_confirmation(
    prepared: TestClient, change: dict[str, str]
) -> None:
    sign_in(prepared, ADMIN_KEY)
    form = {**form_of(prepared, "/console/blocked-users", user_id="u9"), **change}
    answer = prepared.post("/console/blocked-users", data=form)
    assert answer.status_code == 422
    assert "Give a reason" in answer.text
    assert _audit(prepared) == []


@pytest.mark.parametrize("token", ["missing", "wrong", "another session"])
def test_an_action_without_this_sessions_token_is_refused(prepared: TestClient, token: str) -> None:
    sign_in(prepared, ADMIN_KEY)
    form = form_of(prepared, "/console/blocked-users", user_id="u9")
    if token == "missing":
        del form["csrf"]
    elif token == "wrong":
        form["csrf"] = "x" * 43
    else:  # the token of an earlier session: each sign-in makes a new one
        sign_in(prepared, ADMIN_KEY)
        assert csrf_of(prepared.get("/console").text) != form["csrf"]
    refused = prepared.post("/console/blocked-users", data=form)
    assert refused.status_code == 403
    assert "Form expired" in refused.text
    assert_secure_headers(refused)
    assert _audit(prepared) == []
    listed = assert_ok(prepared.get("/v1/admin/blocked-users", headers=ADMIN), 200)
    assert [user["user_id"] for user in listed["blocked_users"]] == ["bad1"]


@pytest.mark.parametrize(("page", "target", "extra", "action", "subject"), ACTIONS)
def test_a_viewer_sees_no_action_and_is_refused_if_it_posts(
    prepared: TestClient,
    page: str,
    target: str,
    extra: dict[str, str],
    action: str,
    subject: str,
) -> None:
    sign_in(prepared, VIEWER_KEY)
    shown = prepared.get(page)
    assert shown.status_code == 200
    assert action_forms(parts_of(shown.text)) == []
    assert 'name="reason"' not in shown.text
    refused = prepared.post(target, data=form_of(prepared, page, **extra))
    assert refused.status_code == 403
    assert "cannot act" in refused.text
    assert _audit(prepared) == []


def test_a_signed_out_post_leads_to_the_sign_in(prepared: TestClient) -> None:
    answer = prepared.post(
        "/console/blocked-users",
        data={"user_id": "u9", "reason": "r", "confirm": "yes", "csrf": "x"},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/signin?next=%2Fconsole"
    assert _audit(prepared) == []


def test_an_action_form_is_bounded_and_typed(prepared: TestClient) -> None:
    sign_in(prepared, ADMIN_KEY)
    form = form_of(prepared, "/console/blocked-users", user_id="u9")
    as_json = prepared.post("/console/blocked-users", json=form)
    assert as_json.status_code == 415
    huge = prepared.post("/console/blocked-users", data={**form, "reason": "r" * 20_000})
    assert huge.status_code == 413
    assert _audit(prepared) == []
