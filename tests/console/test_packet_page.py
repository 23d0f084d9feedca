"""The packet page shows a packet as it was sent (message, recipients, whether a password is
needed: never the password), its commitment and, once ended, the revealed salt and how many
shares; its grabs a bounded page at a time; `withdrawn` in the listing's filter."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.support.console import assert_no_inline_script, assert_secure_headers, sign_in
from tests.support.fixtures import SendPacket
from tests.support.http import ADMIN, ADMIN_KEY, SERVICE, assert_ok

PASSWORD = "open-sesame-9137"


def _page(client: TestClient, path: str, status: int = 200) -> tuple[str, Any]:
    answer = client.get(path)
    assert answer.status_code == status, (path, answer.text[:2000])
    assert answer.headers["content-type"].startswith("text/html")
    assert_secure_headers(answer)
    return answer.text, assert_no_inline_script(answer.text)


def _grab(client: TestClient, pid: str, uid: str, password: str | None = None) -> Any:
    body = {"user_id": uid} if password is None else {"user_id": uid, "password": password}
    return assert_ok(client.post(f"/v1/redpackets/{pid}/grab", json=body, headers=SERVICE), 200)


@pytest.fixture
def termed(client: TestClient, sent_packet: SendPacket) -> TestClient:
    """A password packet for three recipients with a greeting (p1, grabbed once) and an
    admin signed in."""
    sent_packet(
        300,
        3,
        funds=1000,
        packet_id="p1",
        message="<b>Happy</b> new year",
        recipients=["r1", "r2", "r3"],
        password=PASSWORD,
        sender_may_grab=False,
    )
    _grab(client, "p1", "r1", PASSWORD)
    assert sign_in(client, ADMIN_KEY).status_code == 303
    return client


def test_the_page_shows_the_terms_and_the_commitment_but_never_the_password(
    termed: TestClient,
) -> None:
    body = assert_ok(termed.get("/v1/redpackets/p1", headers=SERVICE), 200)
    text, parts = _page(termed, "/console/redpackets/p1")
    assert "Message: <q>&lt;b&gt;Happy&lt;/b&gt; new year</q>" in text
    assert '<dd data-recipients="3">3</dd>' in text
    assert '<dd data-password="needed">needed</dd>' in text
    assert f'<code data-commitment="shares_sha256">{body["shares_sha256"]}</code>' in text
    assert "revealed once the packet has ended" in text and "data-revealed" not in text
    assert PASSWORD not in text
    assert parts.panels[("data-packet", "p1")]["status"] == "active"


def test_a_packet_for_anyone_without_a_password_says_so(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(200, 2, funds=200, packet_id="p2")
    sign_in(client, ADMIN_KEY)
    text, _parts = _page(client, "/console/redpackets/p2")
    assert '<dd data-recipients="0">anyone</dd>' in text
    assert '<dd data-password="none">none</dd>' in text and "Message:" not in text


def test_a_withdrawn_packet_shows_its_salt_and_share_count_not_its_shares(
    termed: TestClient,
) -> None:
    withdraw = termed.post(
        "/v1/redpackets/p1/withdraw", json={"sender_id": "alice"}, headers=SERVICE
    )
    body = assert_ok(withdraw, 200)
    assert body["status"] == "withdrawn" and len(body["shares"]) == 3
    text, parts = _page(termed, "/console/redpackets/p1")
    assert parts.panels[("data-packet", "p1")]["status"] == "withdrawn"
    assert '<p data-revealed="3">Revealed: 3 shares' in text
    assert f'<code data-commitment="salt">{body["salt"]}</code>' in text
    assert "<code>GET /v1/redpackets/p1</code>" in text
    assert str(body["shares"]) not in text and ", ".join(map(str, body["shares"])) not in text
    assert PASSWORD not in text

    listed, _ = _page(termed, "/console/redpackets?status=withdrawn")
    assert 'data-packet="p1"' in listed and '<option value="withdrawn" selected>' in listed
    active, _ = _page(termed, "/console/redpackets?status=active")
    assert 'data-packet="p1"' not in active


def test_the_integrity_page_stays_green_after_a_withdrawal(termed: TestClient) -> None:
    withdraw = termed.post(
        "/v1/redpackets/p1/withdraw", json={"sender_id": "alice"}, headers=SERVICE
    )
    assert_ok(withdraw, 200)
    for job in ("flush_records", "reconcile"):
        assert_ok(termed.post(f"/v1/admin/jobs/{job}/run", headers=ADMIN), 200)
    text, _parts = _page(termed, "/console/integrity")
    for check in ("money conserved", "seats within size", "grabs recorded"):
        assert f'data-check="{check}" data-ok="true"' in text, check


def test_the_grabs_are_shown_a_bounded_page_at_a_time(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(1030, 103, funds=1030, packet_id="p3", strategy="equal")
    for number in range(1, 103):
        _grab(client, "p3", f"g{number}")
    body = assert_ok(client.get("/v1/redpackets/p3", headers=SERVICE), 200)
    assert body["grabs_next_cursor"] == "100"
    sign_in(client, ADMIN_KEY)

    first, _ = _page(client, "/console/redpackets/p3")
    assert "<td>g100</td>" in first and "<td>g101</td>" not in first
    assert first.count("<tr><td>") == 100
    assert '<a href="/console/redpackets/p3?cursor=100">Later grabs</a>' in first
    assert "First grabs" not in first

    later, _ = _page(client, "/console/redpackets/p3?cursor=100")
    assert "<tr><td>101</td><td>g101</td>" in later and "<tr><td>102</td><td>g102</td>" in later
    assert later.count("<tr><td>") == 2 and "<td>g100</td>" not in later
    assert "Later grabs" not in later
    assert '<a href="/console/redpackets/p3">First grabs</a>' in later
    assert "cents grabbed from grab 101 on" in later


@pytest.mark.parametrize("cursor", ["abc", "-1", "1234567", "1%0A", "1.5"])
def test_a_bad_grabs_cursor_answers_422_not_a_500(termed: TestClient, cursor: str) -> None:
    _page(termed, f"/console/redpackets/p1?cursor={cursor}", 422)
