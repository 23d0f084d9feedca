"""A viewer key (the console's reader) reads through the API and changes nothing."""

from __future__ import annotations

from starlette.testclient import TestClient

from tests.support.console import VIEWER_KEY
from tests.support.fixtures import SendPacket
from tests.support.http import assert_ok, assert_problem

VIEWER = {"Authorization": f"Bearer {VIEWER_KEY}"}


def test_a_viewer_key_reads_and_is_refused_every_change(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(300, 3, funds=300, packet_id="p1")
    assert assert_ok(client.get("/v1/redpackets/p1", headers=VIEWER), 200)["remaining_count"] == 3
    grab = client.post("/v1/redpackets/p1/grab", json={"user_id": "u1"}, headers=VIEWER)
    assert_problem(grab, 403, "forbidden")
    made = client.post("/v1/activities", json={"activity_id": "a1"}, headers=VIEWER)
    assert_problem(made, 403, "forbidden")
    deposit = client.post(
        "/v1/accounts/u1/deposits", json={"amount_cents": 5, "reference": "r"}, headers=VIEWER
    )
    assert_problem(deposit, 403, "forbidden")
    assert assert_ok(client.get("/v1/redpackets/p1", headers=VIEWER), 200)["remaining_count"] == 3
