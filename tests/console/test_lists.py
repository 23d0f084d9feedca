"""The activity and red-packet lists, the activity's teams by status, and closing an
activity from its page: hooks, live rows, filters, pages, CSRF, viewer and audit."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from groupbuy.console import pages
from groupbuy.console.pages import ACTIVITY_FIELDS, PACKET_FIELDS
from tests.support.console import (
    VIEWER_KEY,
    action_forms,
    assert_no_inline_script,
    assert_secure_headers,
    form_of,
    parts_of,
    sign_in,
)
from tests.support.fixtures import SendPacket
from tests.support.http import (
    ADMIN,
    ADMIN_KEY,
    SERVICE,
    assert_ok,
    grab,
    lock,
    make_activity,
    open_team,
)


def _run(client: TestClient, job: str) -> Any:
    return assert_ok(client.post(f"/v1/admin/jobs/{job}/run", headers=ADMIN), 200)


@pytest.fixture
def stocked(client: TestClient, sent_packet: SendPacket) -> TestClient:
    """Two activities (a2 newer, with a formed team and a lock), two packets of two
    senders (p1 grabbed once), flushed to SQL, and an admin signed in."""
    make_activity(client, "a1", team_size=3)
    make_activity(client, "a2", team_size=2)
    open_team(client, "a1", "t1", "lead1")
    open_team(client, "a2", "t1", "lead2")
    open_team(client, "a2", "t2", "lead3")
    assert_ok(lock(client, "a2", "t1", "u1"), 201)
    confirm = {"user_id": "u1", "order_id": "o1"}
    assert_ok(client.post("/v1/activities/a2/teams/t1/members", json=confirm, headers=SERVICE), 201)
    assert_ok(lock(client, "a2", "t2", "u2"), 201)
    sent_packet(500, 5, funds=1000, sender_id="alice", packet_id="p1")
    sent_packet(300, 3, funds=300, sender_id="bob", packet_id="p2")
    assert_ok(grab(client, "p1", "g1"), 200)
    _run(client, "flush_records")
    assert sign_in(client, ADMIN_KEY).status_code == 303
    return client


def _page(client: TestClient, path: str, status: int = 200) -> tuple[str, Any]:
    answer = client.get(path)
    assert answer.status_code == status, (path, answer.text[:2000])
    assert_secure_headers(answer)
    return answer.text, assert_no_inline_script(answer.text)


def test_the_activities_list_is_newest_first_with_the_listings_counts(stocked: TestClient) -> None:
    text, parts = _page(stocked, "/console/activities")
    listed = assert_ok(stocked.get("/v1/activities", headers=SERVICE), 200)["activities"]
    assert [body["activity_id"] for body in listed] == ["a2", "a1"]
    assert text.index('data-activity="a2"') < text.index('data-activity="a1"')
    for body in listed:
        row = parts.panels[("data-activity", body["activity_id"])]
        assert row == {name: str(body[name]) for name in ACTIVITY_FIELDS if name in body}
        assert f'href="/console/activities/{body["activity_id"]}"' in text
    assert 'href="/console/activities" aria-current="page"' in text


def test_the_activities_list_filters_by_status_and_pages(
    stocked: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_ok(stocked.patch("/v1/activities/a1", json={"status": "closed"}, headers=ADMIN), 200)
    closed, _ = _page(stocked, "/console/activities?status=closed")
    assert 'data-activity="a1"' in closed and 'data-activity="a2"' not in closed
    opened, _ = _page(stocked, "/console/activities?status=open")
    assert 'data-activity="a2"' in opened and 'data-activity="a1"' not in opened
    monkeypatch.setattr(pages, "PAGE", 1)
    first, _ = _page(stocked, "/console/activities")
    assert 'data-activity="a2"' in first and 'data-activity="a1"' not in first
    cursor = assert_ok(stocked.get("/v1/activities?limit=1", headers=SERVICE), 200)["next_cursor"]
    assert f"cursor={cursor}" in first
    second, _ = _page(stocked, f"/console/activities?cursor={cursor}")
    assert 'data-activity="a1"' in second and 'data-activity="a2"' not in second
    assert "Older" not in second


def test_the_packets_list_filters_by_sender_and_status(stocked: TestClient) -> None:
    text, parts = _page(stocked, "/console/redpackets")
    for pid in ("p1", "p2"):
        body = assert_ok(stocked.get(f"/v1/redpackets/{pid}", headers=SERVICE), 200)
        assert parts.panels[("data-packet", pid)] == {n: str(body[n]) for n in PACKET_FIELDS}
        assert f'href="/console/redpackets/{pid}"' in text
    assert parts.panels[("data-packet", "p1")]["remaining_count"] == "4"
    bob, _ = _page(stocked, "/console/redpackets?sender_id=bob")
    assert 'data-packet="p2"' in bob and 'data-packet="p1"' not in bob
    active, _ = _page(stocked, "/console/redpackets?status=active&sender_id=alice")
    assert 'data-packet="p1"' in active and 'data-packet="p2"' not in active
    none, _ = _page(stocked, "/console/redpackets?status=sold_out")
    assert "data-packet=" not in none and "No red packet matches" in none


def test_the_lists_rows_are_live(stocked: TestClient) -> None:
    query = "/console/live.json?page=packets&sender_id=alice"
    before = assert_ok(stocked.get(query), 200)
    assert before == {"page": "packets", "rows": {"p1": {**before["rows"]["p1"]}}}
    assert before["rows"]["p1"]["remaining_count"] == 4
    assert_ok(grab(stocked, "p1", "g2"), 200)
    after = assert_ok(stocked.get(query), 200)["rows"]["p1"]
    assert after["remaining_count"] == 3 and set(after) == set(PACKET_FIELDS)
    activities = assert_ok(stocked.get("/console/live.json?page=activities&status=open"), 200)
    listed = assert_ok(stocked.get("/v1/activities", headers=SERVICE), 200)["activities"]
    assert activities == {
        "page": "activities",
        "rows": {
            body["activity_id"]: {n: body[n] for n in ACTIVITY_FIELDS if n in body}
            for body in listed
        },
    }
    text, _ = _page(stocked, "/console/redpackets?sender_id=alice")
    assert 'data-live="packets" data-live-query="sender_id=alice"' in text


def test_the_activity_page_lists_its_teams_by_status(stocked: TestClient) -> None:
    opened, _ = _page(stocked, "/console/activities/a1")
    assert 'data-teams="open"' in opened and 'data-team="t1"' in opened
    full, _ = _page(stocked, "/console/activities/a2")  # t2: a member and a lock of two seats
    assert "No open team with a free seat" in full and "data-team=" not in full
    formed, _ = _page(stocked, "/console/activities/a2?teams=formed")
    assert 'data-teams="formed"' in formed
    assert 'data-team="t1"' in formed and 'data-team="t2"' not in formed
    failed, _ = _page(stocked, "/console/activities/a2?teams=failed")
    assert "No failed team" in failed and "data-team=" not in failed


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/console/activities?status=gone", 422),
        ("/console/activities?cursor=abc", 422),
        ("/console/redpackets?status=lost", 422),
        ("/console/redpackets?sender_id=bad%20id", 422),
        ("/console/redpackets?cursor=12", 422),
        ("/console/activities/a2?teams=all", 422),
        ("/console/activities/a2?teams=formed&cursor=zz", 422),
        ("/console/activities/nope?teams=formed", 404),
        ("/console/live.json?page=activities&status=gone", 400),
        ("/console/live.json?page=packets&cursor=x", 400),
    ],
)
def test_bad_list_values_answer_4xx(stocked: TestClient, path: str, status: int) -> None:
    assert stocked.get(path).status_code == status


def _audit(client: TestClient) -> list[dict[str, Any]]:
    page = assert_ok(client.get("/v1/admin/audit", headers=ADMIN), 200)
    return [e for e in page["entries"] if e["action"] == "activity.close"]


def test_closing_an_activity_from_its_page_is_audited(stocked: TestClient) -> None:
    text, parts = _page(stocked, "/console/activities/a1")
    assert [form["action"] for form in action_forms(parts)] == [
        "/console/activities/a1/close",
        "/console/activities/a1/stock",
        "/console/activities/a1/end",
    ]
    form = form_of(stocked, "/console/activities/a1", reason="sale ended early")
    done = stocked.post("/console/activities/a1/close", data=form, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/console/activities/a1"
    assert assert_ok(stocked.get("/v1/activities/a1", headers=SERVICE), 200)["status"] == "closed"
    [entry] = _audit(stocked)
    assert entry["target"] == "a1" and entry["reason"] == "sale ended early"
    assert entry["actor"].startswith("admin:")
    assert entry["detail"] == {"status": "closed", "closed_now": True}
    back, parts = _page(stocked, "/console/activities/a1")
    assert "activity.close a1: done" in back
    assert "<span data-activity-status>closed</span>" in back
    assert action_forms(parts) == []  # a closed activity stays closed
    refused = open_team_answer(stocked)
    assert refused.status_code == 409
    audit_page, _ = _page(stocked, "/console/audit")
    assert "sale ended early" in audit_page


def open_team_answer(client: TestClient) -> Any:
    return client.post("/v1/activities/a1/teams", json={"leader_id": "late"}, headers=SERVICE)


def test_closing_an_unknown_activity_is_refused_and_audited(stocked: TestClient) -> None:
    form = form_of(stocked, "/console/activities/a1")
    refused = stocked.post("/console/activities/nope/close", data=form)
    assert refused.status_code == 404
    [entry] = _audit(stocked)
    assert entry["target"] == "nope" and entry["detail"]["error"] == "activity_not_found"


def test_closing_needs_this_sessions_token_and_a_reason(stocked: TestClient) -> None:
    form = form_of(stocked, "/console/activities/a1")
    for change, status in (
        ({"csrf": "x" * 43}, 403),
        ({"reason": " "}, 422),
        ({"confirm": ""}, 422),
    ):
        answer = stocked.post("/console/activities/a1/close", data={**form, **change})
        assert answer.status_code == status
    assert assert_ok(stocked.get("/v1/activities/a1", headers=SERVICE), 200)["status"] == "open"
    assert _audit(stocked) == []


def test_a_viewer_sees_no_close_form_and_is_refused(stocked: TestClient) -> None:
    sign_in(stocked, VIEWER_KEY)
    for path in ("/console/activities", "/console/activities/a1", "/console/redpackets"):
        text, parts = _page(stocked, path)
        assert action_forms(parts) == [] and 'name="reason"' not in text
    form = form_of(stocked, "/console/activities/a1")
    refused = stocked.post("/console/activities/a1/close", data=form)
    assert refused.status_code == 403 and "cannot act" in refused.text
    assert assert_ok(stocked.get("/v1/activities/a1", headers=SERVICE), 200)["status"] == "open"
    assert _audit(stocked) == []


def test_signed_out_the_lists_lead_to_the_sign_in(client: TestClient) -> None:
    for path in ("/console/activities?status=open", "/console/redpackets"):
        answer = client.get(path, follow_redirects=False)
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/console/signin?next=%2Fconsole%2F")
    assert parts_of("") is not None


# -- the sale: change the stock and the end (audited) ------------------------------------


def _sale_audit(client: TestClient, action: str) -> list[dict[str, Any]]:
    page = assert_ok(client.get("/v1/admin/audit", headers=ADMIN), 200)
    return [e for e in page["entries"] if e["action"] == action]


def test_the_stock_and_the_end_change_from_the_page_and_are_audited(stocked: TestClient) -> None:
    text, _ = _page(stocked, "/console/activities/a2")
    assert '<dd data-field="stock">no cap</dd>' in text
    form = form_of(stocked, "/console/activities/a2", reason="more units", stock="10")
    done = stocked.post("/console/activities/a2/stock", data=form, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/console/activities/a2"
    body = assert_ok(stocked.get("/v1/activities/a2", headers=SERVICE), 200)
    assert (body["stock"], body["stock_left"]) == (10, 6)  # 3 members and a lock hold 4
    [entry] = _sale_audit(stocked, "activity.stock")
    assert entry["target"] == "a2" and entry["reason"] == "more units"
    assert entry["detail"] == {"stock": 10, "stock_left": 6}
    back, _ = _page(stocked, "/console/activities/a2")
    assert '<dd data-field="stock_left">6</dd>' in back

    form = form_of(stocked, "/console/activities/a2", reason="too few", stock="3")
    refused = stocked.post("/console/activities/a2/stock", data=form)
    assert refused.status_code == 409
    [_, entry] = _sale_audit(stocked, "activity.stock")  # newest first
    assert entry["detail"] == {"stock": 10, "stock_left": 6}
    assert assert_ok(stocked.get("/v1/activities/a2", headers=SERVICE), 200)["stock"] == 10

    ends = "2999-01-01T00:00:00.000Z"
    form = form_of(stocked, "/console/activities/a2", reason="longer", ends_at=ends)
    done = stocked.post("/console/activities/a2/end", data=form, follow_redirects=False)
    assert done.status_code == 303
    assert assert_ok(stocked.get("/v1/activities/a2", headers=SERVICE), 200)["ends_at"] == ends
    [entry] = _sale_audit(stocked, "activity.end")
    assert entry["detail"] == {"ends_at": ends, "status": "open"}


def test_bad_stock_or_end_forms_answer_422_and_change_nothing(stocked: TestClient) -> None:
    before = assert_ok(stocked.get("/v1/activities/a1", headers=SERVICE), 200)
    for target, extra in (
        ("stock", {"stock": "0"}),
        ("stock", {"stock": "many"}),
        ("stock", {"stock": "-1"}),
        ("stock", {}),
        ("end", {"ends_at": "soon"}),
        ("end", {"ends_at": "2030-01-01T00:00:00"}),
        ("end", {}),
    ):
        form = form_of(stocked, "/console/activities/a1", **extra)
        answer = stocked.post(f"/console/activities/a1/{target}", data=form)
        assert answer.status_code == 422, (target, extra, answer.text[:500])
    assert assert_ok(stocked.get("/v1/activities/a1", headers=SERVICE), 200) == before
