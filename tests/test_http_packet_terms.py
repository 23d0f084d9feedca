"""Red packets as people send them, over HTTP: recipients, a password, the sender kept out,
a greeting, withdrawal, paged grabs, and the commitment revealed once the packet ended."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.support.fixtures import FundUser, SendPacket
from tests.support.http import SERVICE, app_services, assert_ok, assert_problem, portal, send

PASSWORD = "恭喜发财 2027"


def grab(client: TestClient, pid: str, uid: str, password: str | None = None) -> Any:
    body: dict[str, Any] = {"user_id": uid}
    if password is not None:
        body["password"] = password
    return client.post(f"/v1/redpackets/{pid}/grab", json=body, headers=SERVICE)


def withdraw(client: TestClient, pid: str, sender: str) -> Any:
    return client.post(
        f"/v1/redpackets/{pid}/withdraw", json={"sender_id": sender}, headers=SERVICE
    )


def get(client: TestClient, path: str) -> Any:
    return assert_ok(client.get(path, headers=SERVICE), 200)


def balance(client: TestClient, user: str) -> int:
    return int(get(client, f"/v1/accounts/{user}")["balance_cents"])


def drained(client: TestClient) -> None:
    portal(client).call(app_services(client).packets.writer.drain_all)


def verify(packet: dict[str, Any], grabs: list[int]) -> None:
    """The verifier docs/concepts.md gives shops, run on the packet as GET answers it; then
    every grab (past the first 100 too) against the revealed shares."""
    text = (Path(__file__).parents[1] / "docs" / "concepts.md").read_text(encoding="utf-8")
    code = text.split("<!-- verifier -->\n```python\n", 1)[1].split("```", 1)[0]
    ran = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(packet), capture_output=True, text=True
    )
    assert ran.returncode == 0 and ran.stdout.startswith("fair:"), ran
    assert grabs == packet["shares"][: len(grabs)]


def test_a_group_packet_with_a_password(
    client: TestClient, sent_packet: SendPacket, caplog: pytest.LogCaptureFixture
) -> None:
    sent = sent_packet(
        300,
        3,
        funds=1000,
        message="新年快乐",
        recipients=["ann", "bob", "cy", "alice"],
        password=PASSWORD,
        sender_may_grab=False,
    )
    assert sent["message"] == "新年快乐" and len(sent["shares_sha256"]) == 64
    assert_problem(grab(client, "p1", "eve", PASSWORD), 403, "not_a_recipient")
    assert_problem(grab(client, "p1", "alice", PASSWORD), 403, "sender_cannot_grab")
    assert assert_problem(grab(client, "p1", "ann"), 403, "wrong_password")["attempts_left"] == 5
    for left in (4, 3, 2, 1, 0):
        wrong = assert_problem(grab(client, "p1", "ann", "guess"), 403, "wrong_password")
        assert wrong["attempts_left"] == left
    assert_problem(grab(client, "p1", "ann", PASSWORD), 403, "password_locked")
    amounts = [assert_ok(grab(client, "p1", u, PASSWORD), 200)["amount_cents"] for u in ("bob",)]
    packet = get(client, "/v1/redpackets/p1")
    assert (packet["recipients_count"], packet["password_protected"]) == (4, True)
    assert packet["message"] == "新年快乐" and packet["shares"] is None and packet["salt"] is None
    assert [g["amount_cents"] for g in packet["grabs"]] == amounts
    drained(client)
    feed = client.get("/v1/events?after=0&limit=100", headers=SERVICE).text
    everything = feed + str(packet) + caplog.text
    assert PASSWORD not in everything and "guess" not in everything
    sent_event = next(
        e
        for e in client.get("/v1/events?after=0", headers=SERVICE).json()["events"]
        if e["type"] == "packet.sent"
    )
    assert sent_event["data"]["password_protected"] is True


def test_withdraw_refunds_the_rest_once(client: TestClient, sent_packet: SendPacket) -> None:
    sent_packet(500, 5, funds=500)
    got = assert_ok(grab(client, "p1", "u1"), 200)["amount_cents"]
    assert_problem(withdraw(client, "p1", "mallory"), 403, "not_the_sender")
    body = assert_ok(withdraw(client, "p1", "alice"), 200)
    assert (body["status"], body["refunded_cents"]) == ("withdrawn", 500 - got)
    assert assert_ok(withdraw(client, "p1", "alice"), 200)["refunded_cents"] == 500 - got
    assert_problem(grab(client, "p1", "u2"), 410, "withdrawn")
    assert balance(client, "alice") == 500 - got  # the refund is in SQL when answered
    verify(body, [got])
    drained(client)
    feed = client.get("/v1/events?after=0&limit=100", headers=SERVICE).json()["events"]
    ends = [(e["type"], e["data"].get("reason")) for e in feed if e["type"] != "packet.sent"]
    assert ends == [("packet.withdrawn", None), ("packet.refunded", "withdrawn")]
    listed = get(client, "/v1/redpackets?status=withdrawn")["packets"]
    assert [p["packet_id"] for p in listed] == ["p1"]


def test_an_ended_packet_cannot_be_withdrawn(client: TestClient, sent_packet: SendPacket) -> None:
    sent_packet(2, 1, funds=2)
    assert_ok(grab(client, "p1", "u1"), 200)
    ended = assert_problem(withdraw(client, "p1", "alice"), 409, "packet_ended")
    assert ended["packet_status"] == "sold_out"
    assert_problem(withdraw(client, "nope", "alice"), 404, "packet_not_found")


def test_grabs_are_paged_and_one_grab_is_one_read(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(1300, 130, funds=1300, strategy="double_mean")
    got = [assert_ok(grab(client, "p1", f"u{i}"), 200)["amount_cents"] for i in range(130)]
    packet = get(client, "/v1/redpackets/p1")
    assert len(packet["grabs"]) == 100 and packet["grabs_next_cursor"] == "100"
    rest = get(client, "/v1/redpackets/p1/grabs?cursor=100&limit=100")
    assert [g["user_id"] for g in rest["grabs"]] == [f"u{i}" for i in range(100, 130)]
    assert rest["next_cursor"] is None
    first = get(client, "/v1/redpackets/p1/grabs?limit=7")
    assert len(first["grabs"]) == 7 and first["next_cursor"] == "7"
    one = get(client, "/v1/redpackets/p1/grabs/u42")
    assert one["amount_cents"] == got[42] and set(one) == {"user_id", "amount_cents", "grabbed_at"}
    assert_problem(
        client.get("/v1/redpackets/p1/grabs/nobody", headers=SERVICE), 404, "not_grabbed"
    )
    verify(packet, got)  # sold out: the commitment is revealed
    swapped = [*packet["shares"][1::-1], *packet["shares"][2:]]  # the first two swapped
    if swapped != packet["shares"]:
        with pytest.raises(AssertionError):
            verify(packet | {"shares": swapped}, [])
    largest = max(range(130), key=lambda i: (got[i], -i))
    assert packet["luckiest_user_id"] == f"u{largest}"


BAD_SENDS: dict[str, dict[str, Any]] = {
    "too many recipients": {"recipients": [f"u{i}" for i in range(1001)]},
    "a recipient twice": {"recipients": ["ann", "bob", "ann"]},
    "a bad recipient id": {"recipients": ["ann", "b ob"]},
    "no recipients": {"recipients": []},
    "more shares than recipients": {"count": 3, "recipients": ["ann", "bob"]},
    "a control character": {"message": "hi\u0007"},
    "a long message": {"message": "x" * 101},
    "a long password": {"password": "p" * 65},
    "an empty password": {"password": ""},
    "a password that is not text": {"password": 1234},
}


@pytest.mark.parametrize("case", sorted(BAD_SENDS))
def test_bad_terms_are_refused_with_nothing_debited(
    client: TestClient, funded_user: FundUser, case: str
) -> None:
    funded_user("alice", 1000)
    body = {"sender_id": "alice", "amount_cents": 100, "count": 2, **BAD_SENDS[case]}
    assert_problem(send(client, **body), 422, "invalid_request")
    assert balance(client, "alice") == 1000
    assert get(client, "/v1/redpackets?sender_id=alice")["packets"] == []


def test_a_repeated_send_must_repeat_its_terms(client: TestClient, sent_packet: SendPacket) -> None:
    sent = sent_packet(100, 2, funds=1000, recipients=["ann", "bob"], password="pw")
    again = {"sender_id": "alice", "amount_cents": 100, "count": 2, "packet_id": "p1"}
    same = assert_ok(send(client, **again, recipients=["ann", "bob"], password="pw"), 200)
    assert same["shares_sha256"] == sent["shares_sha256"]
    assert_problem(send(client, **again, recipients=["ann", "cy"], password="pw"), 409, "conflict")
    assert_problem(
        send(client, **again, recipients=["ann", "bob"], password="pw2"), 409, "conflict"
    )
    assert balance(client, "alice") == 900
