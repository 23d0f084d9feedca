"""HTTP tests of the two listings: GET /v1/redpackets (newest first, by sender and status)
and GET /v1/accounts/{user_id}/entries (the ledger, newest first), on fakeredis, a real
redis-server and a 3-master cluster, each over SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from groupbuy_client import wire
from starlette.testclient import TestClient

from tests.support.backends import ALL
from tests.support.fixtures import FundUser, SendPacket
from tests.support.http import (
    ADMIN,
    SERVICE,
    app_services,
    assert_ok,
    assert_problem,
    deposit,
    grabbed,
    ms,
    portal,
    send,
)

pytestmark = pytest.mark.parametrize("backend", ALL)

SUMMARY_KEYS = set(wire.PacketSummary.__required_keys__)  # the shape's fields
ENTRY_KEYS = {"kind", "amount_cents", "balance_after_cents", "reference", "at"}


def packets_page(client: TestClient, **query: Any) -> Any:
    body = assert_ok(client.get("/v1/redpackets", params=query, headers=SERVICE), 200)
    assert set(body) == {"packets", "next_cursor"}, body
    assert len(body["packets"]) <= int(query.get("limit", 20))
    for packet in body["packets"]:
        assert set(packet) == SUMMARY_KEYS, packet
    return body


def all_packets(client: TestClient, **query: Any) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = packets_page(client, **query, **({"cursor": cursor} if cursor else {}))
        ids += [p["packet_id"] for p in page["packets"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids


def entries_page(client: TestClient, uid: str, **query: Any) -> Any:
    body = assert_ok(client.get(f"/v1/accounts/{uid}/entries", params=query, headers=SERVICE), 200)
    assert set(body) == {"entries", "next_cursor"}, body
    for entry in body["entries"]:
        assert ENTRY_KEYS <= set(entry) <= ENTRY_KEYS | {"packet_id"}, entry
        ms(entry["at"])
    return body


def one_packet(client: TestClient, pid: str) -> Any:
    return assert_ok(client.get(f"/v1/redpackets/{pid}", headers=SERVICE), 200)


def drain(client: TestClient) -> None:
    portal(client).call(app_services(client).packets.writer.drain_all)


def sent(client: TestClient, pid: str, sender: str, amount: int = 100, count: int = 2) -> None:
    body = {"packet_id": pid, "sender_id": sender, "amount_cents": amount, "count": count}
    assert_ok(send(client, **body), 201)


def test_packets_page_newest_first_without_repeats_or_skips_while_sending(
    client: TestClient, funded_user: FundUser
) -> None:
    funded_user("alice", 100_000)
    funded_user("bob", 100_000)
    for n in range(7):
        sent(client, f"p{n}", "alice" if n % 2 else "bob")
    first = packets_page(client, limit=3)
    assert [p["packet_id"] for p in first["packets"]] == ["p6", "p5", "p4"]
    # Packets sent between pages are newer than the cursor: later pages neither repeat
    # nor skip what the first page did not show.
    sent(client, "late1", "alice")
    sent(client, "late2", "bob")
    seen = [p["packet_id"] for p in first["packets"]]
    cursor = first["next_cursor"]
    while cursor is not None:
        page = packets_page(client, limit=3, cursor=cursor)
        seen += [p["packet_id"] for p in page["packets"]]
        cursor = page["next_cursor"]
    assert seen == [f"p{n}" for n in range(6, -1, -1)]
    assert all_packets(client, limit=100)[:2] == ["late2", "late1"]
    # One sender's packets, and the page size at its bounds.
    assert all_packets(client, sender_id="alice", limit=1) == ["late1", "p5", "p3", "p1"]
    assert all_packets(client, sender_id="nobody") == []
    assert len(packets_page(client, limit=100)["packets"]) == 9


def test_packet_bodies_match_get_one_live_and_from_sql(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(300, 2, funds=1000, packet_id="done", strategy="equal")
    sent_packet(500, 3, packet_id="live")
    grabbed(client, "live", "u1")
    grabbed(client, "done", "u1")
    grabbed(client, "done", "u2")
    drain(client)
    listed = {p["packet_id"]: p for p in packets_page(client)["packets"]}
    for pid in ("done", "live"):
        one = one_packet(client, pid)
        assert listed[pid] == {k: v for k, v in one.items() if k in SUMMARY_KEYS}, pid
    assert listed["live"]["remaining_count"] == 2 and listed["live"]["status"] == "active"
    assert listed["done"]["status"] == "sold_out" and listed["done"]["remaining_cents"] == 0
    # Once Redis let the ended packet go, SQL answers the same body.
    svc = app_services(client)
    keys = svc.keys.packet_keys("done").named().values()
    portal(client).call(svc.redis.delete, *keys)
    assert packets_page(client)["packets"][1] == listed["done"]


def test_packets_by_status_follow_the_live_state(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(100, 1, funds=10_000, packet_id="sold")
    sent_packet(100, 2, packet_id="open", expires_in_s=60)
    sent_packet(100, 2, packet_id="old", expires_in_s=10)
    grabbed(client, "sold", "u1")
    grabbed(client, "old", "u1")
    # Whether or not the write-behind told SQL of the sale yet, the live state decides.
    assert all_packets(client, status="active") == ["old", "open"]
    drain(client)
    assert all_packets(client, status="sold_out") == ["sold"]
    app_services(client).clock.advance(11)
    portal(client).call(app_services(client).packets.sweeps.expire_due)
    drain(client)
    assert all_packets(client, status="active") == ["open"]
    expired = packets_page(client, status="expired")["packets"]
    assert [p["packet_id"] for p in expired] == ["old"]
    assert expired[0]["refunded_cents"] == expired[0]["remaining_cents"] > 0
    assert expired[0]["remaining_count"] == 1


@pytest.mark.parametrize(
    "query",
    [
        {"limit": 0},
        {"limit": 101},
        {"limit": "x"},
        {"status": "pending"},
        {"sender_id": "a b"},
        {"cursor": "123"},
        {"cursor": "1.a b"},
        {"cursor": "x.p1"},
        {"cursor": "99999999999999.p1"},  # past year 9999: no datetime holds it
        {"after": "1"},
    ],
)
def test_packets_bad_query_is_422(client: TestClient, query: dict[str, Any]) -> None:
    assert_problem(client.get("/v1/redpackets", params=query, headers=SERVICE), 422)


def test_entries_newest_first_with_balances_and_packets(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(300, 2, funds=1000, packet_id="pk", sender_id="alice", strategy="equal")
    grabbed(client, "pk", "bob")
    grabbed(client, "pk", "alice")
    drain(client)
    alice = entries_page(client, "alice")["entries"]
    assert [(e["kind"], e["amount_cents"], e["balance_after_cents"]) for e in alice] == [
        ("grab", 150, 850),
        ("send", -300, 700),
        ("deposit", 1000, 1000),
    ]
    assert [e.get("packet_id") for e in alice] == ["pk", "pk", None]
    assert alice[2]["reference"] == "dep-alice-1000"
    bob = entries_page(client, "bob")
    assert [(e["kind"], e["balance_after_cents"]) for e in bob["entries"]] == [("grab", 150)]
    assert bob["next_cursor"] is None
    assert entries_page(client, "nobody") == {"entries": [], "next_cursor": None}


def test_entries_pages_neither_repeat_nor_skip_while_entries_are_written(
    client: TestClient,
) -> None:
    for n in range(5):
        assert_ok(deposit(client, "carol", n + 1, f"r{n}"), 201)
    first = entries_page(client, "carol", limit=2)
    assert [e["reference"] for e in first["entries"]] == ["r4", "r3"]
    for n in range(5, 8):  # written between pages: newer than the cursor
        assert_ok(deposit(client, "carol", n + 1, f"r{n}"), 201)
    seen = [e["reference"] for e in first["entries"]]
    cursor = first["next_cursor"]
    while cursor is not None:
        page = entries_page(client, "carol", limit=2, cursor=cursor)
        seen += [e["reference"] for e in page["entries"]]
        cursor = page["next_cursor"]
    assert seen == ["r4", "r3", "r2", "r1", "r0"]
    newest = entries_page(client, "carol", limit=100)["entries"]
    assert [e["reference"] for e in newest] == [f"r{n}" for n in range(7, -1, -1)]
    # balance_after is the running sum, the newest one the balance
    assert [e["balance_after_cents"] for e in reversed(newest)] == [
        sum(range(1, n + 2)) for n in range(8)
    ]
    balance = assert_ok(client.get("/v1/accounts/carol", headers=SERVICE), 200)
    assert balance["balance_cents"] == newest[0]["balance_after_cents"]


@pytest.mark.parametrize(
    "query", [{"limit": 0}, {"limit": 101}, {"cursor": "-1"}, {"cursor": "a"}, {"x": "1"}]
)
def test_entries_bad_query_is_422_and_bad_user_too(
    client: TestClient, query: dict[str, Any]
) -> None:
    assert_problem(client.get("/v1/accounts/u/entries", params=query, headers=SERVICE), 422)
    assert_problem(client.get("/v1/accounts/a.b/entries", headers=SERVICE), 422)


def test_cursors_at_their_bounds_answer_pages(client: TestClient, funded_user: FundUser) -> None:
    funded_user("alice", 1000)
    sent(client, "p1", "alice")
    far = packets_page(client, cursor="9999999999999.zzz")
    assert [p["packet_id"] for p in far["packets"]] == ["p1"]
    assert packets_page(client, cursor="0.a") == {"packets": [], "next_cursor": None}
    assert entries_page(client, "alice", cursor="999999999999999999")["entries"]
    assert entries_page(client, "alice", cursor="0")["entries"] == []


def test_listings_need_a_key(client: TestClient) -> None:
    assert_problem(client.get("/v1/redpackets"), 401, "unauthorized")
    assert_problem(client.get("/v1/accounts/u/entries"), 401, "unauthorized")
    assert_ok(client.get("/v1/redpackets", headers=ADMIN), 200)
