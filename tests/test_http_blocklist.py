"""HTTP tests of the admin blocklist (SPEC §3, blocked users), on fakeredis and redis-server.

A blocked user's seat lock, join, team open, confirm, grab and send are refused with 403
`user_blocked` by the script of the operation itself, with nothing applied; the list lives
in SQL and its Redis copy is rebuilt when Redis lost it.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from starlette.testclient import TestClient

from groupbuy.redpacket.models import LedgerEntryRow, PacketRow
from groupbuy.storage.events import EventRow
from tests.support.backends import ALL
from tests.support.fixtures import FundUser, SendPacket
from tests.support.http import (
    ADMIN,
    SERVICE,
    app_services,
    assert_ok,
    assert_problem,
    grab,
    grabbed,
    lock,
    make_activity,
    ms,
    open_team,
    portal,
    send,
)

# Also on a 3-master Redis Cluster.
pytestmark = pytest.mark.parametrize("backend", ALL)

AID = "act"


def block(client: TestClient, uid: str, **body: Any) -> Any:
    return assert_ok(client.put(f"/v1/admin/blocked-users/{uid}", json=body, headers=ADMIN), 200)


def unblock(client: TestClient, uid: str) -> Any:
    return assert_ok(client.delete(f"/v1/admin/blocked-users/{uid}", headers=ADMIN), 200)


def blocked_page(client: TestClient, **query: Any) -> Any:
    return assert_ok(client.get("/v1/admin/blocked-users", params=query, headers=ADMIN), 200)


def test_admins_block_unblock_and_list_users(client: TestClient) -> None:
    entry = block(client, "u1", reason="chargebacks")
    assert set(entry) == {"user_id", "reason", "blocked_at"}
    assert entry["user_id"] == "u1" and entry["reason"] == "chargebacks"
    since = ms(entry["blocked_at"])
    # A repeat replaces the reason and keeps when the block began.
    again = block(client, "u1")
    assert again == {"user_id": "u1", "reason": None, "blocked_at": entry["blocked_at"]}
    assert ms(again["blocked_at"]) == since
    for uid in ("u3", "u2", "u5", "u4"):
        block(client, uid, reason=f"why {uid}")

    first = blocked_page(client, limit=2)
    assert [e["user_id"] for e in first["blocked_users"]] == ["u1", "u2"]
    second = blocked_page(client, limit=2, cursor=first["next_cursor"])
    assert [e["user_id"] for e in second["blocked_users"]] == ["u3", "u4"]
    third = blocked_page(client, limit=2, cursor=second["next_cursor"])
    assert third == {
        "blocked_users": [third["blocked_users"][0]],
        "next_cursor": None,
    }
    assert third["blocked_users"][0]["reason"] == "why u5"

    assert unblock(client, "u3") == {"user_id": "u3", "unblocked": True}
    assert unblock(client, "u3") == {"user_id": "u3", "unblocked": False}
    page = blocked_page(client)
    assert [e["user_id"] for e in page["blocked_users"]] == ["u1", "u2", "u4", "u5"]
    assert page["next_cursor"] is None


def test_a_reason_is_kept_as_written_but_nul_is_refused(client: TestClient) -> None:
    """Any text survives SQL (accents, CJK, emoji, tabs and newlines); U+0000, which
    PostgreSQL's text types cannot hold, is a 422 on every database, nothing blocked."""
    reason = "Rückbuchung 退款 🚫\tline one\nline two"
    assert block(client, "u1", reason=reason)["reason"] == reason
    assert blocked_page(client)["blocked_users"][0]["reason"] == reason  # read from SQL
    refused = client.put("/v1/admin/blocked-users/u2", json={"reason": "a\u0000b"}, headers=ADMIN)
    assert_problem(refused, 422, "invalid_request")
    assert [e["user_id"] for e in blocked_page(client)["blocked_users"]] == ["u1"]


def test_the_blocklist_is_for_admins_only(client: TestClient) -> None:
    paths: list[tuple[str, str, dict[str, Any] | None]] = [
        ("PUT", "/v1/admin/blocked-users/u1", {}),
        ("DELETE", "/v1/admin/blocked-users/u1", None),
        ("GET", "/v1/admin/blocked-users", None),
    ]
    for method, path, body in paths:
        assert_problem(client.request(method, path, json=body, headers=SERVICE), 403, "forbidden")
        assert_problem(client.request(method, path, json=body), 401, "unauthorized")
    assert_problem(
        client.put("/v1/admin/blocked-users/a:b", json={}, headers=ADMIN), 422, "invalid_request"
    )
    assert_problem(
        client.put("/v1/admin/blocked-users/u1", json={"reason": "x" * 501}, headers=ADMIN),
        422,
        "invalid_request",
    )
    assert_problem(
        client.get("/v1/admin/blocked-users", params={"cursor": "a b"}, headers=ADMIN),
        422,
        "invalid_request",
    )
    assert blocked_page(client) == {"blocked_users": [], "next_cursor": None}


def test_a_blocked_user_takes_no_seat(client: TestClient) -> None:
    make_activity(client, AID, team_size=3)
    open_team(client, AID, "t1", "lead")
    assert_ok(lock(client, AID, "t1", "payer"), 201)
    block(client, "bad")
    block(client, "payer")

    body = assert_problem(lock(client, AID, "t1", "bad"), 403, "user_blocked")
    assert body["user_id"] == "bad"
    join = client.post(f"/v1/activities/{AID}/locks", json={"user_id": "bad"}, headers=SERVICE)
    assert_problem(join, 403, "user_blocked")
    opened = client.post(
        f"/v1/activities/{AID}/teams", json={"leader_id": "bad", "team_id": "t2"}, headers=SERVICE
    )
    assert_problem(opened, 403, "user_blocked")
    # The payer locked before the block: the confirm is refused (the backend refunds).
    confirm = client.post(
        f"/v1/activities/{AID}/teams/t1/members",
        json={"user_id": "payer", "order_id": "o1"},
        headers=SERVICE,
    )
    assert_problem(confirm, 403, "user_blocked")

    team = assert_ok(client.get(f"/v1/activities/{AID}/teams/t1", headers=SERVICE), 200)
    assert [m["user_id"] for m in team["members"]] == ["lead"]
    assert [lk["user_id"] for lk in team["locks"]] == ["payer"]
    assert team["version"] == 2  # opened, one lock: nothing the refusals did
    missing = client.get(f"/v1/activities/{AID}/teams/t2", headers=SERVICE)
    assert_problem(missing, 404, "team_not_found")

    unblock(client, "bad")
    assert_ok(lock(client, AID, "t1", "bad"), 201)


def test_a_blocked_user_grabs_and_sends_nothing(
    client: TestClient, funded_user: FundUser, sent_packet: SendPacket
) -> None:
    pid = sent_packet(300, 3, funds=300)["packet_id"]
    before = grabbed(client, pid, "early")
    funded_user("bad", 1_000)
    block(client, "bad")
    block(client, "early")

    assert_problem(grab(client, pid, "bad"), 403, "user_blocked")
    # A share taken before the block is still answered.
    repeat = assert_ok(grab(client, pid, "early"), 200)
    assert repeat == {"status": "already_grabbed", "amount_cents": before}
    packet = assert_ok(client.get(f"/v1/redpackets/{pid}", headers=SERVICE), 200)
    assert packet["remaining_count"] == 2

    refused = send(client, sender_id="bad", amount_cents=500, count=5, packet_id="pb")
    assert assert_problem(refused, 403, "user_blocked")["user_id"] == "bad"
    account = assert_ok(client.get("/v1/accounts/bad", headers=SERVICE), 200)
    assert account["balance_cents"] == 1_000
    assert_problem(client.get("/v1/redpackets/pb", headers=SERVICE), 404, "packet_not_found")
    services = app_services(client)

    async def recorded() -> tuple[int, int, int]:
        async with services.database.sessions() as session:
            packets = await session.scalar(select(func.count()).where(PacketRow.packet_id == "pb"))
            debits = await session.scalar(
                select(func.count()).where(LedgerEntryRow.business_key == "packet_debit:pb")
            )
            events = await session.scalar(
                select(func.count()).where(EventRow.dedup_key.like("%:pb"))
            )
        return int(packets or 0), int(debits or 0), int(events or 0)

    assert portal(client).call(recorded) == (0, 0, 0)

    unblock(client, "bad")
    assert_ok(send(client, sender_id="bad", amount_cents=500, count=5, packet_id="pb"), 201)
    assert assert_ok(client.get("/v1/accounts/bad", headers=SERVICE), 200)["balance_cents"] == 500


def test_redis_losing_the_blocklist_gets_it_back_from_sql(client: TestClient) -> None:
    make_activity(client, AID, team_size=3)
    open_team(client, AID, "t1", "lead")
    block(client, "bad", reason="fraud")
    block(client, "worse")
    services = app_services(client)
    keys = services.keys
    key = keys.blocked_users()
    # The hash, and on Redis Cluster also the copy the activity's slot reads.
    lost = {key, keys.blocked_users(keys.activity_slot(AID))}

    async def lose() -> None:
        for name in lost:
            await services.redis.delete(name)

    portal(client).call(lose)
    assert_ok(lock(client, AID, "t1", "bad"), 201)  # Redis forgot the block
    report = assert_ok(client.post("/v1/admin/jobs/repair/run", headers=ADMIN), 200)
    assert report["blocked_users"] == 2 and report["blocklist_rebuilt"] == len(lost)
    assert_problem(lock(client, AID, "t1", "worse"), 403, "user_blocked")
    again = assert_ok(client.post("/v1/admin/jobs/repair/run", headers=ADMIN), 200)
    assert again["blocklist_rebuilt"] == 0  # equal copies: nothing rewritten

    async def copy() -> dict[str, str]:
        return dict(await services.redis.hgetall(key))

    stored = portal(client).call(copy)
    assert set(stored) == {"bad", "worse"}
    assert stored["bad"].endswith("|fraud")
