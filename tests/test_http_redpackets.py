"""HTTP tests of accounts, red packets and their events (SPEC §2, §3, §4.3, §4.4, §4.8).

Every test runs on fakeredis and on a real redis-server (the `client` fixture).
Packet expiry is tested by moving the scripts' clock (`services.clock.advance`);
grab credits and endings reach SQL through the write-behind, which the tests drain
through the app's portal so that balances and events are checked deterministically.
"""

from __future__ import annotations

import time
from typing import Any

import httpx2 as httpx
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
    grab,
    grabbed,
    ms,
    portal,
    send,
)

# Also on a 3-master Redis Cluster.
pytestmark = pytest.mark.parametrize("backend", ALL)


# The shapes' fields, as groupbuy_client.wire names them.
SENT_KEYS = set(wire.PacketSent.__required_keys__)
PACKET_KEYS = set(wire.Packet.__required_keys__)
GRAB_KEYS = {"user_id", "amount_cents", "grabbed_at"}
DAY_S = 86400

BAD_IDS: list[Any] = [
    "",
    "x" * 65,
    "a b",
    "a.b",
    "a/b",
    "a:b",
    "{p:x}",
    "a*",
    "é",
    "a\nb",
    "a\x00b",
    7,
    None,
    True,
    ["a"],
    {"id": "a"},
]


# -- helpers ------------------------------------------------------------------------


def balance(client: TestClient, uid: str) -> int:
    body = assert_ok(client.get(f"/v1/accounts/{uid}", headers=SERVICE), 200)
    assert set(body) == {"user_id", "balance_cents"} and body["user_id"] == uid, body
    assert type(body["balance_cents"]) is int, body
    return int(body["balance_cents"])


def already(client: TestClient, pid: str, uid: str) -> int:
    """A repeated grab: 200 already_grabbed; returns the amount it reports."""
    body = assert_ok(grab(client, pid, uid), 200)
    assert set(body) == {"status", "amount_cents"}, body
    assert body["status"] == "already_grabbed", body
    return int(body["amount_cents"])


def raw_packet(client: TestClient, pid: str) -> httpx.Response:
    return client.get(f"/v1/redpackets/{pid}", headers=SERVICE)


def packet(client: TestClient, pid: str) -> Any:
    body = assert_ok(raw_packet(client, pid), 200)
    check_packet(body)
    return body


def check_packet(p: dict[str, Any]) -> None:
    """The packet body of SPEC §3 and the invariants of SPEC §4.3."""
    assert set(p) == PACKET_KEYS, p
    assert p["status"] in ("active", "sold_out", "expired"), p
    assert p["strategy"] in ("double_mean", "equal"), p
    ms(p["expires_at"])
    grabs = p["grabs"]
    assert len(grabs) <= p["count"], p
    for g in grabs:
        assert set(g) == GRAB_KEYS, g
        assert type(g["amount_cents"]) is int and g["amount_cents"] >= 1, g
    users = [g["user_id"] for g in grabs]
    assert len(users) == len(set(users)), "no user grabs twice"
    stamps = [ms(g["grabbed_at"]) for g in grabs]
    assert stamps == sorted(stamps), "grabs are listed in grab order"
    total = sum(g["amount_cents"] for g in grabs)
    assert total <= p["amount_cents"], p
    assert p["remaining_count"] == p["count"] - len(grabs), p
    if p["status"] == "active":
        assert p["remaining_count"] >= 1 and p["remaining_cents"] == p["amount_cents"] - total, p
        assert p["refunded_cents"] == 0 and p["luckiest_user_id"] is None, p
    elif p["status"] == "sold_out":
        assert p["remaining_count"] == 0 and p["remaining_cents"] == 0, p
        assert total == p["amount_cents"] and p["refunded_cents"] == 0, p
        best = max(g["amount_cents"] for g in grabs)
        earliest_best = next(g["user_id"] for g in grabs if g["amount_cents"] == best)
        assert p["luckiest_user_id"] == earliest_best, p
    else:
        assert p["remaining_count"] >= 1, p
        assert p["refunded_cents"] == p["amount_cents"] - total, p
        assert p["remaining_cents"] in (0, p["refunded_cents"]), p
        assert p["luckiest_user_id"] is None, p


def drain(client: TestClient) -> None:
    """Write every pending grab, sold-out and refund record to SQL now."""
    portal(client).call(app_services(client).packets.writer.drain_all)


def expire_due(client: TestClient) -> Any:
    return portal(client).call(app_services(client).packets.sweeps.expire_due)


def advance(client: TestClient, seconds: float) -> None:
    app_services(client).clock.advance(seconds)


def drop_from_redis(client: TestClient, pid: str) -> None:
    """Make Redis forget a drained, ended packet, as its retention TTL would."""
    svc = app_services(client)
    outbox = svc.keys.packet_outbox(pid)
    assert portal(client).call(svc.redis.xlen, outbox) == 0, "records not yet in SQL"
    portal(client).call(svc.redis.delete, *svc.keys.packet_keys(pid).named().values())
    assert portal(client).call(svc.redis.exists, *svc.keys.packet_keys(pid).named().values()) == 0


def events(client: TestClient) -> list[dict[str, Any]]:
    page = assert_ok(client.get("/v1/events?after=0&limit=1000", headers=SERVICE), 200)
    ids = [e["id"] for e in page["events"]]
    assert ids == sorted(set(ids)) and all(i > 0 for i in ids), ids
    return list(page["events"])


def packet_events(client: TestClient, kind: str, pid: str) -> list[dict[str, Any]]:
    return [e for e in events(client) if e["type"] == kind and e["data"].get("packet_id") == pid]


def assert_422(response: httpx.Response) -> None:
    assert_problem(response, 422, "invalid_request")


# -- accounts ---------------------------------------------------------------------------


def test_deposit_201_then_same_reference_200_not_credited_twice(client: TestClient) -> None:
    r = deposit(client, "alice", 1500, "ref-1")
    assert assert_ok(r, 201) == {"user_id": "alice", "balance_cents": 1500}
    r = deposit(client, "alice", 1500, "ref-1")
    assert assert_ok(r, 200) == {"user_id": "alice", "balance_cents": 1500}
    assert balance(client, "alice") == 1500
    r = deposit(client, "alice", 250, "ref-2")
    assert assert_ok(r, 201) == {"user_id": "alice", "balance_cents": 1750}
    # Retrying the first deposit later still changes nothing.
    assert assert_ok(deposit(client, "alice", 1500, "ref-1"), 200)["balance_cents"] == 1750
    assert balance(client, "alice") == 1750


def test_deposit_reference_reused_for_another_deposit_409_conflict(
    client: TestClient, funded_user: FundUser
) -> None:
    funded_user("alice", 1000, "ref-1")
    assert_problem(deposit(client, "alice", 999, "ref-1"), 409, "conflict")
    assert_problem(deposit(client, "bob", 1000, "ref-1"), 409, "conflict")
    assert_problem(deposit(client, "bob", 5, "ref-1"), 409, "conflict")
    assert balance(client, "alice") == 1000
    assert balance(client, "bob") == 0
    # The original deposit is still recognised as such.
    assert assert_ok(deposit(client, "alice", 1000, "ref-1"), 200)["balance_cents"] == 1000


def test_deposit_needs_the_admin_role(client: TestClient) -> None:
    assert_problem(deposit(client, "alice", 100, "r1", headers=SERVICE), 403, "forbidden")
    assert_problem(deposit(client, "alice", 100, "r1", headers={}), 401, "unauthorized")
    wrong = {"Authorization": "Bearer nope"}
    assert_problem(deposit(client, "alice", 100, "r1", headers=wrong), 401, "unauthorized")
    assert balance(client, "alice") == 0
    # The refused attempts did not use up the reference.
    assert assert_ok(deposit(client, "alice", 100, "r1"), 201)["balance_cents"] == 100


def test_deposit_amount_out_of_range_or_not_an_integer_422(client: TestClient) -> None:
    for amount in (
        0,
        -1,
        -(10**12),
        10**12 + 1,
        10**30,
        "100",
        "1e3",
        1.0,
        1.5,
        True,
        False,
        None,
        [100],
        {"cents": 100},
    ):
        assert_422(deposit(client, "alice", amount, "r-bad"))
    assert_422(
        client.post("/v1/accounts/alice/deposits", json={"reference": "r-bad"}, headers=ADMIN)
    )
    assert balance(client, "alice") == 0
    # The bounds themselves are accepted, and the refused attempts did not use "r-bad".
    assert assert_ok(deposit(client, "alice", 1, "r-bad"), 201)["balance_cents"] == 1
    assert assert_ok(deposit(client, "alice", 10**12, "r-max"), 201)["balance_cents"] == 10**12 + 1


def test_deposit_bad_reference_user_id_or_fields_422(client: TestClient) -> None:
    for bad in BAD_IDS:
        assert_422(deposit(client, "alice", 100, bad))
    assert_422(
        client.post("/v1/accounts/alice/deposits", json={"amount_cents": 100}, headers=ADMIN)
    )
    assert_422(
        client.post(
            "/v1/accounts/alice/deposits",
            json={"amount_cents": 100, "reference": "r1", "user_id": "bob"},
            headers=ADMIN,
        )
    )
    for segment in ("a.b", "a%20b", "x" * 65, "a:b", "%C3%A9"):
        assert_422(
            client.post(
                f"/v1/accounts/{segment}/deposits",
                json={"amount_cents": 100, "reference": "r1"},
                headers=ADMIN,
            )
        )
        assert_422(client.get(f"/v1/accounts/{segment}", headers=SERVICE))
    assert balance(client, "alice") == 0 and balance(client, "bob") == 0
    assert assert_ok(deposit(client, "alice", 100, "r1"), 201)["balance_cents"] == 100


def test_account_of_unknown_user_is_zero(client: TestClient) -> None:
    r = client.get("/v1/accounts/nobody", headers=SERVICE)
    assert assert_ok(r, 200) == {"user_id": "nobody", "balance_cents": 0}
    assert assert_ok(client.get("/v1/accounts/nobody", headers=ADMIN), 200)["balance_cents"] == 0
    assert_problem(client.get("/v1/accounts/nobody"), 401, "unauthorized")


# -- send -------------------------------------------------------------------------------


def test_send_201_exact_body_and_sender_debited(client: TestClient, funded_user: FundUser) -> None:
    funded_user("alice", 5000)
    before = time.time() * 1000
    r = send(
        client,
        sender_id="alice",
        amount_cents=1200,
        count=4,
        packet_id="p1",
        expires_in_s=600,
        strategy="equal",
    )
    after = time.time() * 1000
    body = assert_ok(r, 201)
    assert set(body) == SENT_KEYS, body
    assert {k: v for k, v in body.items() if k not in ("expires_at", "shares_sha256")} == {
        "packet_id": "p1",
        "sender_id": "alice",
        "amount_cents": 1200,
        "count": 4,
        "strategy": "equal",
        "status": "active",
        "message": None,
    }
    assert len(body["shares_sha256"]) == 64
    assert before + 600_000 - 2000 <= ms(body["expires_at"]) <= after + 600_000 + 2000, body
    assert balance(client, "alice") == 3800
    p = packet(client, "p1")
    assert {k: p[k] for k in SENT_KEYS} == body
    assert p["grabs"] == [] and p["remaining_count"] == 4 and p["remaining_cents"] == 1200


def test_send_defaults_generated_id_double_mean_one_day(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    funded_user("alice", 5000)
    before = time.time() * 1000
    body = assert_ok(send(client, sender_id="alice", amount_cents=700, count=3), 201)
    after = time.time() * 1000
    assert set(body) == SENT_KEYS, body
    pid = body["packet_id"]
    assert (
        isinstance(pid, str)
        and 1 <= len(pid) <= 64
        and pid.replace("_", "").replace("-", "").isalnum()
    ), pid
    assert body["strategy"] == "double_mean" and body["status"] == "active", body
    assert before + DAY_S * 1000 - 2000 <= ms(body["expires_at"]) <= after + DAY_S * 1000 + 2000
    assert balance(client, "alice") == 4300
    assert packet(client, pid)["amount_cents"] == 700
    # Two sends without an id are two packets.
    other = assert_ok(send(client, sender_id="alice", amount_cents=700, count=3), 201)
    assert other["packet_id"] != pid
    assert balance(client, "alice") == 3600
    # An explicit null is the same as leaving the optional fields out.
    nulls = sent_packet(
        sender_id="alice", amount_cents=10, count=1, packet_id=None, expires_in_s=None
    )
    assert nulls["strategy"] == "double_mean"
    assert nulls["packet_id"] not in (pid, other["packet_id"])


def test_send_repeat_same_id_and_params_200_debits_once(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    funded_user("alice", 1000)
    params: dict[str, Any] = {
        "sender_id": "alice",
        "amount_cents": 1000,
        "count": 5,
        "packet_id": "p1",
        "expires_in_s": 300,
    }
    first = sent_packet(**params)
    assert balance(client, "alice") == 0
    # The balance is now 0: a retry must not be taken for a second debit.
    for _ in range(3):
        assert assert_ok(send(client, **params), 200) == first
    assert balance(client, "alice") == 0
    # The default strategy, spelt out, is the same parameters.
    assert assert_ok(send(client, **params, strategy="double_mean"), 200) == first
    assert len(packet_events(client, "packet.sent", "p1")) == 1
    # Grabbing works once; the repeat did not create a second set of shares.
    amounts = [grabbed(client, "p1", f"u{i}") for i in range(5)]
    assert sum(amounts) == 1000
    assert_problem(grab(client, "p1", "u5"), 409, "sold_out")


def test_send_retried_after_the_packet_ended_neither_debits_nor_revives_it(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    funded_user("alice", 1000)
    sold: dict[str, Any] = {
        "sender_id": "alice",
        "amount_cents": 200,
        "count": 2,
        "packet_id": "sold",
    }
    lapsed: dict[str, Any] = {
        "sender_id": "alice",
        "amount_cents": 300,
        "count": 3,
        "packet_id": "lapsed",
        "expires_in_s": 20,
    }
    first = {
        "sold": sent_packet(**sold),
        "lapsed": sent_packet(**lapsed),
    }
    grabbed(client, "sold", "bob")
    grabbed(client, "sold", "carol")
    a = grabbed(client, "lapsed", "bob")
    advance(client, 21)
    expire_due(client)
    drain(client)
    assert balance(client, "alice") == 500 + 300 - a
    ended = {"sold": packet(client, "sold"), "lapsed": packet(client, "lapsed")}
    drop_from_redis(client, "lapsed")
    for params in (sold, lapsed):
        pid = params["packet_id"]
        again = assert_ok(send(client, **params), 200)
        # The same packet; its status may say what became of it since.
        assert {k: v for k, v in again.items() if k != "status"} == {
            k: v for k, v in first[pid].items() if k != "status"
        }
        assert again["status"] in ("active", ended[pid]["status"]), again
        assert packet(client, pid) == ended[pid]
        assert len(packet_events(client, "packet.sent", pid)) == 1
    assert_problem(grab(client, "sold", "dave"), 409, "sold_out")
    assert_problem(grab(client, "lapsed", "dave"), 410, "expired")
    drain(client)
    assert balance(client, "alice") == 500 + 300 - a
    assert balance(client, "dave") == 0


def test_send_same_id_other_params_409_conflict(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    funded_user("alice", 3000)
    funded_user("bob", 3000)
    params: dict[str, Any] = {
        "sender_id": "alice",
        "amount_cents": 1000,
        "count": 5,
        "packet_id": "p1",
        "expires_in_s": 300,
        "strategy": "double_mean",
    }
    first = sent_packet(**params)
    variants: list[dict[str, Any]] = [
        {"sender_id": "bob"},
        {"amount_cents": 1001},
        {"amount_cents": 999},
        {"count": 4},
        {"expires_in_s": 301},
        {"strategy": "equal"},
    ]
    for change in variants:
        assert_problem(send(client, **{**params, **change}), 409, "conflict")
    # Leaving out expires_in_s means the default (86400), not "whatever it was".
    assert_problem(
        send(client, **{k: v for k, v in params.items() if k != "expires_in_s"}), 409, "conflict"
    )
    assert balance(client, "alice") == 2000 and balance(client, "bob") == 3000
    p = packet(client, "p1")
    assert {k: p[k] for k in SENT_KEYS} == first
    assert len(packet_events(client, "packet.sent", "p1")) == 1


def test_send_insufficient_funds_409_nothing_debited_no_packet(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    funded_user("alice", 500)
    r = send(client, sender_id="alice", amount_cents=501, count=2, packet_id="p1")
    assert_problem(r, 409, "insufficient_funds")
    assert balance(client, "alice") == 500
    assert_problem(raw_packet(client, "p1"), 404, "packet_not_found")
    assert_problem(grab(client, "p1", "bob"), 404, "packet_not_found")
    # A user never seen has nothing to send.
    r = send(client, sender_id="nobody", amount_cents=1, count=1, packet_id="p2")
    assert_problem(r, 409, "insufficient_funds")
    assert balance(client, "nobody") == 0
    assert_problem(raw_packet(client, "p2"), 404, "packet_not_found")
    assert packet_events(client, "packet.sent", "p1") == []
    assert packet_events(client, "packet.sent", "p2") == []
    # The refused id is free: after a top-up the same send succeeds, debiting once.
    funded_user("alice", 1)
    r = send(client, sender_id="alice", amount_cents=501, count=2, packet_id="p1")
    assert assert_ok(r, 201)["packet_id"] == "p1"
    assert balance(client, "alice") == 0
    # Exactly the whole balance is enough; then one cent more is not.
    funded_user("bob", 300)
    sent_packet(sender_id="bob", amount_cents=300, count=3, packet_id="p3")
    assert balance(client, "bob") == 0
    r = send(client, sender_id="bob", amount_cents=1, count=1, packet_id="p4")
    assert_problem(r, 409, "insufficient_funds")
    assert balance(client, "bob") == 0


def test_send_invalid_requests_422_nothing_debited(
    client: TestClient, funded_user: FundUser
) -> None:
    funded_user("alice", 2_000_000)
    good: dict[str, Any] = {
        "sender_id": "alice",
        "amount_cents": 1000,
        "count": 10,
        "packet_id": "p1",
    }
    changes: list[dict[str, Any]] = [
        {"count": 10001, "amount_cents": 20000},  # over max_count
        {"count": 100_001, "amount_cents": 200_000},
        {"amount_cents": 1_000_001},  # over max_amount_cents
        {"amount_cents": 10**12 + 1},
        {"amount_cents": 9},  # less than 1 cent per share
        {"amount_cents": 0},
        {"amount_cents": -1000},
        {"count": 0},
        {"count": -1},
        {"expires_in_s": 0},
        {"expires_in_s": -1},
        {"expires_in_s": 604801},
        {"strategy": "random"},
        {"strategy": "EQUAL"},
        {"strategy": ""},
        {"strategy": 1},
        {"amount_cents": "1000"},
        {"amount_cents": 1000.0},
        {"amount_cents": 10.5},
        {"amount_cents": True},
        {"count": "10"},
        {"count": 10.0},
        {"count": True},
        {"expires_in_s": 60.0},
        {"expires_in_s": "60"},
        {"memo": "happy new year"},
        {"status": "active"},
    ]
    bodies: list[dict[str, Any]] = [{**good, **change} for change in changes]
    bodies += [{**good, "sender_id": bad} for bad in BAD_IDS]
    bodies += [{**good, "packet_id": bad} for bad in BAD_IDS if bad is not None]
    bodies += [
        {k: v for k, v in good.items() if k != field}
        for field in ("sender_id", "amount_cents", "count")
    ]
    bodies.append({})
    # The limits are checked before the funds: a poor sender gets 422, not 409.
    bodies.append({**good, "sender_id": "nobody", "count": 10001, "amount_cents": 20000})
    for body in bodies:
        r = send(client, **body)
        assert r.status_code == 422, (body, r.text)
        assert_422(r)
    assert balance(client, "alice") == 2_000_000
    assert_problem(raw_packet(client, "p1"), 404, "packet_not_found")
    assert [e for e in events(client) if e["type"] == "packet.sent"] == []


def test_send_at_the_limits_201(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    funded_user("alice", 2_000_000)
    at_limits: list[dict[str, Any]] = [
        {"packet_id": "most-shares", "amount_cents": 10000, "count": 10000, "strategy": "equal"},
        {"packet_id": "most-money", "amount_cents": 1_000_000, "count": 1},
        {"packet_id": "one-cent", "amount_cents": 1, "count": 1, "expires_in_s": 1},
        {"packet_id": "longest", "amount_cents": 10, "count": 10, "expires_in_s": 604800},
    ]
    for params in at_limits:
        sent_packet(sender_id="alice", **params)
    assert balance(client, "alice") == 2_000_000 - 10000 - 1_000_000 - 1 - 10
    assert grabbed(client, "most-shares", "u1") == 1
    assert grabbed(client, "most-money", "u1") == 1_000_000
    p = packet(client, "most-shares")
    assert p["remaining_count"] == 9999 and p["remaining_cents"] == 9999


def test_equal_strategy_splits_evenly(client: TestClient, sent_packet: SendPacket) -> None:
    sent_packet(
        funds=10_000,
        sender_id="alice",
        amount_cents=1003,
        count=10,
        packet_id="p1",
        strategy="equal",
    )
    amounts = [grabbed(client, "p1", f"u{i}") for i in range(10)]
    assert sum(amounts) == 1003
    assert max(amounts) - min(amounts) <= 1, amounts
    assert sorted(amounts) == [100] * 7 + [101] * 3
    p = packet(client, "p1")
    assert p["strategy"] == "equal" and p["status"] == "sold_out"
    assert [g["amount_cents"] for g in p["grabs"]] == amounts


def test_double_mean_shares_stay_within_twice_the_mean(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    funded_user("alice", 100_000)
    for n in range(3):
        pid = f"p{n}"
        sent_packet(sender_id="alice", amount_cents=1000, count=8, packet_id=pid)
        remaining, left = 1000, 8
        for i in range(8):
            body = assert_ok(grab(client, pid, f"u{i}"), 200)
            amount = body["amount_cents"]
            assert amount >= 1 and body["remaining_count"] == left - 1, body
            if left > 1:
                # uniform in [1, 2 x mean of what remains): below twice the mean, and
                # leaving at least a cent for each later grabber
                assert amount * left < 2 * remaining, (amount, remaining, left)
                assert remaining - amount >= left - 1
            else:
                assert amount == remaining, "the last grabber takes the rest"
            remaining, left = remaining - amount, left - 1
        assert remaining == 0
        assert packet(client, pid)["status"] == "sold_out"


# -- grab -------------------------------------------------------------------------------


def test_grab_200_then_repeat_already_grabbed_same_amount(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(funds=1000, sender_id="alice", amount_cents=1000, count=3, packet_id="p1")
    first = assert_ok(grab(client, "p1", "bob"), 200)
    assert set(first) == {"status", "amount_cents", "remaining_count"}, first
    assert first["status"] == "grabbed" and first["remaining_count"] == 2, first
    for _ in range(3):
        assert already(client, "p1", "bob") == first["amount_cents"]
    second = assert_ok(grab(client, "p1", "carol"), 200)
    assert second["status"] == "grabbed" and second["remaining_count"] == 1, second
    assert already(client, "p1", "bob") == first["amount_cents"]
    assert already(client, "p1", "carol") == second["amount_cents"]
    p = packet(client, "p1")
    assert p["status"] == "active"
    assert [(g["user_id"], g["amount_cents"]) for g in p["grabs"]] == [
        ("bob", first["amount_cents"]),
        ("carol", second["amount_cents"]),
    ]
    assert p["remaining_count"] == 1
    assert p["remaining_cents"] == 1000 - first["amount_cents"] - second["amount_cents"]
    drain(client)
    assert balance(client, "bob") == first["amount_cents"]
    assert balance(client, "carol") == second["amount_cents"]
    assert balance(client, "alice") == 0


def test_grab_sold_out_409_and_repeat_still_already_grabbed(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(funds=1000, sender_id="alice", amount_cents=500, count=2, packet_id="p1")
    a = grabbed(client, "p1", "bob")
    last = assert_ok(grab(client, "p1", "carol"), 200)
    assert last["status"] == "grabbed" and last["remaining_count"] == 0
    assert a + last["amount_cents"] == 500
    for uid in ("dave", "alice", "dave"):
        assert_problem(grab(client, "p1", uid), 409, "sold_out")
    assert already(client, "p1", "bob") == a
    assert already(client, "p1", "carol") == last["amount_cents"]
    p = packet(client, "p1")
    assert p["status"] == "sold_out" and [g["user_id"] for g in p["grabs"]] == ["bob", "carol"]
    drain(client)
    assert balance(client, "dave") == 0
    assert balance(client, "bob") + balance(client, "carol") == 500
    assert balance(client, "alice") == 500
    # Sold out is final: the expiry time passing changes nothing and refunds nothing.
    advance(client, DAY_S + 1)
    expire_due(client)
    drain(client)
    assert packet(client, "p1") == p
    assert_problem(grab(client, "p1", "dave"), 409, "sold_out")
    assert already(client, "p1", "bob") == a
    assert balance(client, "alice") == 500
    assert packet_events(client, "packet.refunded", "p1") == []


def test_grab_after_expiry_410_and_repeat_still_already_grabbed(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(
        funds=1000, sender_id="alice", amount_cents=1000, count=4, packet_id="p1", expires_in_s=60
    )
    a = grabbed(client, "p1", "bob")
    advance(client, 30)
    b = grabbed(client, "p1", "carol")  # still in time
    advance(client, 31)
    assert_problem(grab(client, "p1", "dave"), 410, "expired")
    assert_problem(grab(client, "p1", "erin"), 410, "expired")
    assert already(client, "p1", "bob") == a
    assert already(client, "p1", "carol") == b
    p = packet(client, "p1")
    assert p["status"] == "expired" and p["refunded_cents"] == 1000 - a - b
    drain(client)
    assert balance(client, "dave") == 0 and balance(client, "erin") == 0
    assert balance(client, "alice") == 1000 - a - b


def test_grab_unknown_packet_404_and_bad_ids_422(
    client: TestClient, sent_packet: SendPacket
) -> None:
    assert_problem(grab(client, "nope", "bob"), 404, "packet_not_found")
    assert_problem(raw_packet(client, "nope"), 404, "packet_not_found")
    sent_packet(funds=100, sender_id="alice", amount_cents=100, count=2, packet_id="p1")
    for bad in BAD_IDS:
        assert_422(client.post("/v1/redpackets/p1/grab", json={"user_id": bad}, headers=SERVICE))
    for body in ({}, {"user_id": "bob", "amount_cents": 100}, {"userId": "bob"}):
        assert_422(client.post("/v1/redpackets/p1/grab", json=body, headers=SERVICE))
    for segment in ("a.b", "a%20b", "x" * 65, "%7Bp%3Ax%7D"):
        assert_422(
            client.post(f"/v1/redpackets/{segment}/grab", json={"user_id": "bob"}, headers=SERVICE)
        )
        assert_422(client.get(f"/v1/redpackets/{segment}", headers=SERVICE))
    assert_problem(
        client.post("/v1/redpackets/p1/grab", json={"user_id": "bob"}), 401, "unauthorized"
    )
    p = packet(client, "p1")
    assert p["grabs"] == [] and p["remaining_count"] == 2 and p["remaining_cents"] == 100


def test_grab_credit_reaches_the_account_within_2s(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(funds=1000, sender_id="alice", amount_cents=1000, count=2, packet_id="p1")
    amount = grabbed(client, "p1", "bob")
    deadline = time.monotonic() + 2.0
    while balance(client, "bob") != amount and time.monotonic() < deadline:
        time.sleep(0.02)
    assert balance(client, "bob") == amount
    # Written once, however often the writer runs.
    drain(client)
    drain(client)
    assert balance(client, "bob") == amount


# -- reading a packet -------------------------------------------------------------------


def test_get_packet_lists_grabs_in_order_with_consistent_remainders(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent = sent_packet(
        funds=10_000,
        sender_id="alice",
        amount_cents=5000,
        count=6,
        packet_id="p1",
        expires_in_s=3600,
    )
    users = ["u5", "u1", "u9", "u0"]  # not alphabetical: order is grab order
    amounts = []
    for n, uid in enumerate(users, start=1):
        amounts.append(grabbed(client, "p1", uid))
        advance(client, 1)  # distinct grab times
        p = packet(client, "p1")
        assert [g["user_id"] for g in p["grabs"]] == users[:n]
        assert [g["amount_cents"] for g in p["grabs"]] == amounts
        assert p["remaining_count"] == 6 - n and p["remaining_cents"] == 5000 - sum(amounts)
        assert p["luckiest_user_id"] is None and p["status"] == "active"
    assert {k: p[k] for k in SENT_KEYS} == sent
    stamps = [ms(g["grabbed_at"]) for g in p["grabs"]]
    assert all(b - a >= 1000 for a, b in zip(stamps, stamps[1:], strict=False)), stamps
    assert abs(stamps[0] - time.time() * 1000) < 5000


def test_luckiest_is_null_until_sold_out_then_the_biggest_grab(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    funded_user("alice", 100_000)
    for n in range(4):
        pid = f"p{n}"
        sent_packet(sender_id="alice", amount_cents=997, count=5, packet_id=pid)
        amounts = {}
        for i in range(5):
            assert packet(client, pid)["luckiest_user_id"] is None
            amounts[f"u{i}"] = grabbed(client, pid, f"u{i}")
        p = packet(client, pid)
        assert p["status"] == "sold_out"
        best = max(amounts.values())
        assert p["luckiest_user_id"] == next(u for u, a in amounts.items() if a == best)


def test_luckiest_tie_goes_to_the_earliest_grab(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    funded_user("alice", 10_000)
    # Every share is 100: all tie, the first grabber wins.
    sent_packet(sender_id="alice", amount_cents=400, count=4, packet_id="tie", strategy="equal")
    for uid in ("zed", "mia", "amy", "bob"):
        assert grabbed(client, "tie", uid) == 100
    p = packet(client, "tie")
    assert p["status"] == "sold_out" and p["luckiest_user_id"] == "zed", p
    # 101, 101, 100: the earlier of the two 101s wins, wherever the shuffle put them.
    sent_packet(sender_id="alice", amount_cents=302, count=3, packet_id="two", strategy="equal")
    amounts = {uid: grabbed(client, "two", uid) for uid in ("xx", "yy", "zz")}
    first_101 = next(uid for uid, a in amounts.items() if a == 101)
    assert packet(client, "two")["luckiest_user_id"] == first_101
    # Still so once the packet is read from SQL.
    drain(client)
    drop_from_redis(client, "tie")
    assert packet(client, "tie")["luckiest_user_id"] == "zed"


def test_expiry_refunds_the_rest_exactly_once(client: TestClient, sent_packet: SendPacket) -> None:
    sent_packet(
        funds=2000, sender_id="alice", amount_cents=1500, count=5, packet_id="p1", expires_in_s=120
    )
    a = grabbed(client, "p1", "bob")
    b = grabbed(client, "p1", "carol")
    expire_due(client)  # not yet due
    assert packet(client, "p1")["status"] == "active"
    advance(client, 121)
    expire_due(client)
    expire_due(client)
    for uid in ("dave", "erin"):
        assert_problem(grab(client, "p1", uid), 410, "expired")
    assert already(client, "p1", "bob") == a
    expire_due(client)
    drain(client)
    p = packet(client, "p1")
    assert p["status"] == "expired" and p["luckiest_user_id"] is None
    assert p["refunded_cents"] == 1500 - a - b
    assert [g["user_id"] for g in p["grabs"]] == ["bob", "carol"]
    assert balance(client, "alice") == 500 + 1500 - a - b
    assert balance(client, "bob") == a and balance(client, "carol") == b
    assert balance(client, "dave") == 0
    refunds = packet_events(client, "packet.refunded", "p1")
    assert len(refunds) == 1, refunds
    assert refunds[0]["data"]["refunded_cents"] == 1500 - a - b
    assert refunds[0]["data"]["sender_id"] == "alice"
    # Running the jobs again later changes nothing.
    advance(client, 3600)
    expire_due(client)
    drain(client)
    assert balance(client, "alice") == 500 + 1500 - a - b
    assert len(packet_events(client, "packet.refunded", "p1")) == 1
    assert packet(client, "p1") == p


def test_lazy_expiry_by_a_read_refunds_once_with_the_job(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(
        funds=1000, sender_id="alice", amount_cents=1000, count=3, packet_id="p1", expires_in_s=10
    )
    a = grabbed(client, "p1", "bob")
    advance(client, 11)
    # The first thing to notice the expiry is a read, then a grab, then the job.
    p = packet(client, "p1")
    assert p["status"] == "expired" and p["refunded_cents"] == 1000 - a
    assert_problem(grab(client, "p1", "carol"), 410, "expired")
    expire_due(client)
    expire_due(client)
    drain(client)
    assert balance(client, "alice") == 1000 - a
    assert len(packet_events(client, "packet.refunded", "p1")) == 1
    assert packet(client, "p1") == p


def test_nothing_grabbed_is_all_refunded(client: TestClient, sent_packet: SendPacket) -> None:
    sent_packet(
        funds=800, sender_id="alice", amount_cents=800, count=8, packet_id="p1", expires_in_s=5
    )
    assert balance(client, "alice") == 0
    advance(client, 6)
    expire_due(client)
    drain(client)
    p = packet(client, "p1")
    assert p["status"] == "expired" and p["refunded_cents"] == 800 and p["grabs"] == []
    assert balance(client, "alice") == 800


def test_sold_out_packet_is_answered_from_sql_after_redis_dropped_it(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(funds=1000, sender_id="alice", amount_cents=1000, count=3, packet_id="p1")
    amounts = {uid: grabbed(client, "p1", uid) for uid in ("bob", "carol", "dave")}
    drain(client)
    live = packet(client, "p1")
    assert live["status"] == "sold_out"
    drop_from_redis(client, "p1")
    assert packet(client, "p1") == live
    for uid, amount in amounts.items():
        assert already(client, "p1", uid) == amount
    assert_problem(grab(client, "p1", "erin"), 409, "sold_out")
    assert packet(client, "p1") == live
    drain(client)
    assert {uid: balance(client, uid) for uid in amounts} == amounts
    assert balance(client, "erin") == 0 and balance(client, "alice") == 0


def test_expired_packet_is_answered_from_sql_after_redis_dropped_it(
    client: TestClient, sent_packet: SendPacket
) -> None:
    sent_packet(
        funds=1000, sender_id="alice", amount_cents=900, count=3, packet_id="p1", expires_in_s=60
    )
    a = grabbed(client, "p1", "bob")
    advance(client, 61)
    expire_due(client)
    drain(client)
    live = packet(client, "p1")
    assert live["status"] == "expired" and live["refunded_cents"] == 900 - a
    drop_from_redis(client, "p1")
    assert packet(client, "p1") == live
    assert already(client, "p1", "bob") == a
    assert_problem(grab(client, "p1", "carol"), 410, "expired")
    expire_due(client)
    drain(client)
    assert packet(client, "p1") == live
    assert balance(client, "alice") == 100 + 900 - a
    assert balance(client, "carol") == 0
    assert len(packet_events(client, "packet.refunded", "p1")) == 1


# -- guarantees -------------------------------------------------------------------------


def test_money_is_conserved_after_a_mixed_scenario(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    deposits = {"alice": [5000, 700], "bob": [3000], "carol": [1234], "dave": [1]}
    for uid, amounts in deposits.items():
        for n, amount in enumerate(amounts):
            funded_user(uid, amount, f"ref-{uid}-{n}")
    assert_ok(deposit(client, "alice", 5000, "ref-alice-0"), 200)  # a retry, not money
    total_deposits = sum(sum(amounts) for amounts in deposits.values())

    sends: list[tuple[str, str, int, int, dict[str, Any]]] = [
        ("sold", "alice", 2000, 3, {}),
        ("lapsed", "bob", 1500, 4, {"expires_in_s": 30}),
        ("open", "carol", 1000, 5, {}),
        ("untouched", "alice", 999, 2, {"strategy": "equal"}),
    ]
    for pid, sender, amount, count, extra in sends:
        sent_packet(sender_id=sender, amount_cents=amount, count=count, packet_id=pid, **extra)
    assert_ok(send(client, sender_id="alice", amount_cents=2000, count=3, packet_id="sold"), 200)
    assert_problem(
        send(client, sender_id="dave", amount_cents=2, count=1, packet_id="poor"),
        409,
        "insufficient_funds",
    )
    for uid in ("bob", "carol", "dave"):
        grabbed(client, "sold", uid)
    for uid in ("alice", "erin"):
        grabbed(client, "lapsed", uid)
    for uid in ("alice", "bob", "frank"):
        grabbed(client, "open", uid)
    already(client, "open", "bob")
    assert_problem(grab(client, "sold", "erin"), 409, "sold_out")
    advance(client, 31)
    expire_due(client)
    assert_problem(grab(client, "lapsed", "frank"), 410, "expired")
    drain(client)

    users = sorted({*deposits, "erin", "frank"})
    balances = {uid: balance(client, uid) for uid in users}
    packets = {pid: packet(client, pid) for pid, *_ in sends}
    assert [p["status"] for p in packets.values()] == ["sold_out", "expired", "active", "active"]
    held = sum(
        p["amount_cents"] - sum(g["amount_cents"] for g in p["grabs"])
        for p in packets.values()
        if p["status"] == "active"
    )
    assert all(value >= 0 for value in balances.values()), balances
    assert total_deposits == sum(balances.values()) + held, (balances, held)
    # Every user's balance is what the packets say they got and gave.
    for uid in users:
        got = sum(
            g["amount_cents"] for p in packets.values() for g in p["grabs"] if g["user_id"] == uid
        )
        gave = sum(
            p["amount_cents"] - p["refunded_cents"]
            for p in packets.values()
            if p["sender_id"] == uid
        )
        assert balances[uid] == sum(deposits.get(uid, [])) + got - gave, uid


def test_events_feed_lists_packet_events(client: TestClient, sent_packet: SendPacket) -> None:
    sent_packet(funds=5000, sender_id="alice", amount_cents=300, count=2, packet_id="soldp")
    sent_packet(sender_id="alice", amount_cents=400, count=2, packet_id="lapsedp", expires_in_s=10)
    assert_ok(send(client, sender_id="alice", amount_cents=300, count=2, packet_id="soldp"), 200)
    grabbed(client, "soldp", "bob")
    grabbed(client, "soldp", "carol")
    b = grabbed(client, "lapsedp", "bob")
    advance(client, 11)
    expire_due(client)
    drain(client)
    feed = events(client)
    mine = [(e["type"], e["data"]["packet_id"]) for e in feed if e["type"].startswith("packet.")]
    assert sorted(mine) == sorted(
        [
            ("packet.sent", "soldp"),
            ("packet.sent", "lapsedp"),
            ("packet.sold_out", "soldp"),
            ("packet.refunded", "lapsedp"),
        ]
    ), mine
    assert mine.index(("packet.sent", "soldp")) < mine.index(("packet.sold_out", "soldp"))
    assert mine.index(("packet.sent", "lapsedp")) < mine.index(("packet.refunded", "lapsedp"))
    by_kind = {(e["type"], e["data"]["packet_id"]): e for e in feed}
    sent = by_kind[("packet.sent", "soldp")]["data"]
    assert sent["sender_id"] == "alice" and sent["amount_cents"] == 300 and sent["count"] == 2
    assert by_kind[("packet.sold_out", "soldp")]["data"]["sender_id"] == "alice"
    refund = by_kind[("packet.refunded", "lapsedp")]["data"]
    assert refund["sender_id"] == "alice" and refund["refunded_cents"] == 400 - b
    for e in feed:
        ms(e["at"])
    # Paging from the last id seen returns nothing new.
    last = feed[-1]["id"]
    page = assert_ok(client.get(f"/v1/events?after={last}", headers=SERVICE), 200)
    assert page == {"events": [], "next_after": last}
