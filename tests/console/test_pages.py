"""Every console page: its status, its key elements and data-field hooks, the security
headers, and no inline script; unknown ids and bad values answer 4xx pages."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.console import feed
from groupbuy.console.pages import ACTIVITY_FIELDS
from groupbuy.settings import Settings
from tests.support.console import (
    assert_no_inline_script,
    assert_secure_headers,
    parts_of,
    sign_in,
)
from tests.support.fixtures import OpenTeam, SendPacket
from tests.support.http import ADMIN, ADMIN_KEY, SERVICE, assert_ok, grab, lock
from tests.support.webhooks import delivery_tried

HOOKED = ["overview", "events", "activity", "team", "packet", "integrity", "webhooks", "audit"]


def _run(client: TestClient, job: str) -> Any:
    return assert_ok(client.post(f"/v1/admin/jobs/{job}/run", headers=ADMIN), 200)


@pytest.fixture
def busy(client: TestClient, opened_team: OpenTeam, sent_packet: SendPacket) -> TestClient:
    """A signed-in admin, an activity with a team and a lock, a packet with a grab, an
    endpoint, a blocked user, and the records flushed to SQL."""
    opened_team("a1", "t1", "leader1")
    assert_ok(lock(client, "a1", "t1", "u2"), 201)
    sent_packet(500, 5, funds=1000, packet_id="p1")
    assert_ok(grab(client, "p1", "g1"), 200)
    endpoint = {"endpoint_id": "e1", "url": "http://127.0.0.1:9/hook", "event_types": ["*"]}
    assert_ok(client.post("/v1/admin/webhooks", json=endpoint, headers=ADMIN), 201)
    assert_ok(
        client.put("/v1/admin/blocked-users/bad1", json={"reason": "fraud"}, headers=ADMIN), 200
    )
    _run(client, "flush_records")
    _run(client, "reconcile")
    assert sign_in(client, ADMIN_KEY).status_code == 303
    return client


def _page(client: TestClient, path: str, status: int = 200) -> Any:
    answer = client.get(path)
    assert answer.status_code == status, (path, answer.text[:2000])
    assert answer.headers["content-type"].startswith("text/html")
    assert_secure_headers(answer)
    parts = assert_no_inline_script(answer.text)
    return answer, parts


def test_the_overview_shows_every_number_with_its_hook(busy: TestClient) -> None:
    answer, _parts = _page(busy, "/console")
    for name in (
        "requests_per_s",
        "locks_per_s",
        "grabs_per_s",
        "client_errors_per_s",
        "server_errors_per_s",
        "p99_ms",
        "redis",
        "database",
        "backlog_teams",
        "backlog_packets",
        "lag_teams_s",
        "lag_packets_s",
        "dead_letters",
        "scheduler_leader",
        "webhook_lag.e1",
        "webhook_pending.e1",
    ):
        assert f'data-field="{name}"' in answer.text, name
    assert '<span data-field="redis">ok</span>' in answer.text
    assert '<span data-field="database">ok</span>' in answer.text
    assert answer.text.count('<svg class="chart"') == 2
    assert '<span data-field="scheduler_leader">this serve</span>' in answer.text


def test_the_overview_says_when_nobody_holds_the_scheduler_lease(settings: Settings) -> None:
    with TestClient(create_app(settings.replace("scheduler", enabled=False))) as client:
        sign_in(client, ADMIN_KEY)
        answer, _parts = _page(client, "/console")
    assert '<span data-field="scheduler_leader">none</span>' in answer.text


def test_the_events_page_tails_the_feed_and_filters_it(busy: TestClient) -> None:
    answer, _parts = _page(busy, "/console/events")
    assert "team.opened" in answer.text and "packet.sent" in answer.text
    assert 'data-live="events"' in answer.text
    only_sent, _ = _page(busy, "/console/events?type=packet.sent")
    assert "packet.sent" in only_sent.text and "team.opened" not in only_sent.text
    team, _ = _page(busy, "/console/events?team_id=t1&activity_id=a1")
    assert "team.opened" in team.text and "packet.sent" not in team.text
    nothing, _ = _page(busy, "/console/events?packet_id=other")
    assert "packet.sent" not in nothing.text and "team.opened" not in nothing.text
    # after the newest event: nothing, and paging back names the earlier page
    later, _ = _page(busy, "/console/events?after=1000000")
    assert "team.opened" not in later.text and "Earlier" in later.text


def test_only_the_tail_of_the_feed_is_live(
    busy: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feed, "PAGE", 1)  # one event a page: the first page is an old one
    tail, _ = _page(busy, "/console/events")
    assert 'data-live="events"' in tail.text
    older, _ = _page(busy, "/console/events?after=0")
    assert "data-live=" not in older.text
    assert "Later" in older.text


def test_the_activity_page_has_its_panel_and_teams(busy: TestClient) -> None:
    answer, parts = _page(busy, "/console/activities/a1")
    body = assert_ok(busy.get("/v1/activities/a1", headers=SERVICE), 200)
    panel = parts.panels[("data-activity", "a1")]
    counts = {name: str(body[name]) for name in ACTIVITY_FIELDS if name in body}
    assert {name: panel[name] for name in counts} == counts  # beside the sale's figures
    assert 'href="/console/activities/a1/teams/t1"' in answer.text
    assert "leader1" in answer.text


def test_the_team_page_shows_its_timeline(busy: TestClient) -> None:
    answer, _parts = _page(busy, "/console/activities/a1/teams/t1")
    assert "leader opened the team: leader1" in answer.text
    assert "seat locked by u2" in answer.text
    assert "/console/events?activity_id=a1&amp;team_id=t1" in answer.text


def test_the_packet_page_has_its_panel_curve_and_grabs(busy: TestClient) -> None:
    answer, parts = _page(busy, "/console/redpackets/p1")
    body = assert_ok(busy.get("/v1/redpackets/p1", headers=SERVICE), 200)
    assert parts.panels[("data-packet", "p1")] == {
        "remaining_count": "4",
        "remaining_cents": str(body["remaining_cents"]),
        "status": "active",
    }
    assert '<svg class="chart"' in answer.text and "<polyline" in answer.text
    assert "<td>g1</td>" in answer.text


def test_the_integrity_page_shows_the_checks_jobs_and_dead_letters(busy: TestClient) -> None:
    answer, parts = _page(busy, "/console/integrity")
    for check in ("money conserved", "seats within size", "grabs recorded"):
        assert f'data-check="{check}" data-ok="true"' in answer.text, check
    for job in ("sweep_locks", "expire_teams", "expire_packets", "flush_records", "reconcile"):
        assert f'action="/console/integrity/jobs/{job}/run"' in answer.text
    assert "No dead letter." in answer.text
    assert '"job": "reconcile"' in answer.text or "&#34;job&#34;: &#34;reconcile" in answer.text


def test_the_webhooks_pages_list_endpoints_and_deliveries(busy: TestClient) -> None:
    answer, _parts = _page(busy, "/console/webhooks")
    assert 'data-endpoint="e1"' in answer.text and "http://127.0.0.1:9/hook" in answer.text
    detail, _ = _page(busy, "/console/webhooks/e1")
    assert 'action="/console/webhooks/e1/replay"' in detail.text
    filtered, _ = _page(busy, "/console/webhooks/e1?status=failed")
    assert "No delivery failed." in filtered.text


def test_a_delivery_retried_many_times_shows_its_newest_attempts(busy: TestClient) -> None:
    database = busy.app.state.services.database  # type: ignore[attr-defined]
    busy.portal.call(delivery_tried, database, "e1", 1, 25)  # type: ignore[union-attr]
    detail, _ = _page(busy, "/console/webhooks/e1")
    shown = [f": {status} in " for status in range(500, 525)]
    assert [status in detail.text for status in shown] == [False] * 15 + [True] * 10
    assert "and 15 older" in detail.text and "/deliveries/evt_1/attempts" in detail.text


def test_the_audit_and_blocked_users_pages(busy: TestClient) -> None:
    _page(busy, "/console/audit")
    blocked, _ = _page(busy, "/console/blocked-users")
    assert 'data-user="bad1"' in blocked.text and "fraud" in blocked.text


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/console/activities/nope", 404),
        ("/console/activities/a1/teams/nope", 404),
        ("/console/redpackets/nope", 404),
        ("/console/webhooks/nope", 404),
        ("/console/activities/bad%24id", 422),
        ("/console/events?after=abc", 422),
        ("/console/events?after=-1", 422),
        ("/console/audit?cursor=x", 422),
        ("/console/integrity?cursor=1e9", 422),
        ("/console/webhooks/e1?status=lost", 422),
        ("/console/webhooks/e1?cursor=abc", 422),
        ("/console/blocked-users?cursor=%20", 422),
    ],
)
def test_unknown_ids_and_bad_values_answer_a_page_not_a_500(
    busy: TestClient, path: str, status: int
) -> None:
    _page(busy, path, status)


def test_the_static_files_are_the_sites_own(client: TestClient) -> None:
    for path, kind in (
        ("/console/static/favicon.svg", "image/svg+xml"),
        ("/console/static/live.js", "text/javascript"),
        ("/console/static/console.css", "text/css"),
    ):
        answer = client.get(path)
        assert answer.status_code == 200, path
        assert answer.headers["content-type"].startswith(kind), answer.headers
        assert_secure_headers(answer)
    assert client.get("/console/static/nothing.js").status_code == 404


def test_the_layout_links_the_favicon_and_the_script(busy: TestClient) -> None:
    answer, parts = _page(busy, "/console")
    assert '<link rel="icon" href="/console/static/favicon.svg"' in answer.text
    assert [attrs["src"] for attrs, _ in parts.scripts] == ["/console/static/live.js"]


def test_the_sign_in_page_itself(client: TestClient) -> None:
    answer = client.get("/console/signin")
    assert answer.status_code == 200
    assert_secure_headers(answer)
    parts = assert_no_inline_script(answer.text)
    assert "signin" in parts.ids
    assert any(field.get("name") == "key" for field in parts.inputs)
    assert parts_of(answer.text).forms[0]["id"] == "signin"
