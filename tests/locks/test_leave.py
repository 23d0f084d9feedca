"""Leaving and refunds (POST .../members/{user_id}/leave) and dissolving a team (POST
/v1/admin/.../dissolve), over HTTP and through the services, on both databases: each answer
and refusal, what SQL holds when a leave answers, the feed, and the rebuild after a loss of
Redis data."""

from __future__ import annotations

import json
from typing import Any

import httpx2 as httpx
import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from groupbuy import errors
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.services import Services
from groupbuy.storage.db import DatabaseUnreachable
from groupbuy.storage.events import EventRow
from tests.support.http import (
    ADMIN,
    ISO_MS,
    SERVICE,
    app_services,
    assert_ok,
    assert_problem,
    lock,
    make_activity,
    open_team,
    portal,
)

AID = "sale"
TEAM = f"/v1/activities/{AID}/teams"


def leave(client: TestClient, tid: str, uid: str, **body: Any) -> httpx.Response:
    return client.post(f"{TEAM}/{tid}/members/{uid}/leave", json=body, headers=SERVICE)


def dissolve(client: TestClient, tid: str, headers: dict[str, str] = ADMIN, **body: Any) -> Any:
    path = f"/v1/admin/activities/{AID}/teams/{tid}/dissolve"
    return client.post(path, json=body, headers=headers)


def join(client: TestClient, tid: str, uid: str, order: str) -> Any:
    assert_ok(lock(client, AID, tid, uid), 201)
    body = {"user_id": uid, "order_id": order}
    return assert_ok(client.post(f"{TEAM}/{tid}/members", json=body, headers=SERVICE), 201)


def get_team(client: TestClient, tid: str) -> Any:
    return assert_ok(client.get(f"{TEAM}/{tid}", headers=SERVICE), 200)


def activity(client: TestClient) -> Any:
    return assert_ok(client.get(f"/v1/activities/{AID}", headers=SERVICE), 200)


async def member_rows(services: Services, tid: str) -> dict[str, MemberRow]:
    async with services.database.sessions() as session:
        query = select(MemberRow).where(MemberRow.activity_id == AID, MemberRow.team_id == tid)
        return {row.user_id: row for row in await session.scalars(query)}


async def events(services: Services, *types: str) -> list[dict[str, Any]]:
    await services.team_writer.drain_all()
    async with services.database.sessions() as session:
        rows = await session.scalars(
            select(EventRow).where(EventRow.type.in_(types)).order_by(EventRow.id)
        )
        return [{"type": row.type, **json.loads(row.data)} for row in rows]


def users(team: dict[str, Any]) -> list[str]:
    return [m["user_id"] for m in team["members"]]


def test_a_member_leaves_an_open_team_and_sql_has_it_when_answered(client: TestClient) -> None:
    make_activity(client, AID, team_size=3, limits={"teams_per_user": 1})
    open_team(client, AID, "t1", "L", "oL")
    join(client, "t1", "u1", "o1")
    services = app_services(client)

    body = assert_ok(leave(client, "t1", "u1", order_id="o1", reason="refund"), 200)
    assert set(body) == {"team", "left"} and body["left"] is True
    assert users(body["team"]) == ["L"] and body["team"]["free_seats"] == 2
    # Answered after SQL has the change (no flush in between).
    row = portal(client).call(member_rows, services, "t1")["u1"]
    assert row.left_at is not None and row.leave_reason == "refund"
    assert activity(client)["members"] == 1
    # A repeat answers the same; the user's teams_per_user count came back: another team.
    again = assert_ok(leave(client, "t1", "u1", order_id="o1", reason="refund"), 200)
    assert again == body
    open_team(client, AID, "t2", "L2")
    assert_ok(lock(client, AID, "t2", "u1"), 201)
    # Who left takes no seat in that team again (409 left_team); others do.
    assert_problem(lock(client, AID, "t1", "u1"), 409, "left_team")
    assert_ok(lock(client, AID, "t1", "u3"), 201)
    left = portal(client).call(events, services, "team.member_left")
    assert [(e["user_id"], e["order_id"], e["reason"]) for e in left] == [("u1", "o1", "refund")]
    assert left[0]["version"] == body["team"]["version"]


def test_refusals_change_nothing(client: TestClient) -> None:
    make_activity(client, AID, team_size=3)
    open_team(client, AID, "t1", "L", "oL")
    join(client, "t1", "u1", "o1")
    before = get_team(client, "t1")
    assert_problem(leave(client, "t1", "u1", order_id="o2"), 409, "order_mismatch")
    assert_problem(leave(client, "t1", "u1"), 409, "order_mismatch")
    assert_problem(leave(client, "t1", "x", order_id="o1"), 404, "not_a_member")
    assert_problem(leave(client, "nope", "u1", order_id="o1"), 404, "team_not_found")
    for bad in (
        {"order_id": "o 1"},
        {"order_id": "o1", "reason": "x" * 201},
        {"order_id": "o1", "reason": ""},
        {"order_id": "o1", "extra": 1},
        {"order_id": 7},
    ):
        assert_problem(leave(client, "t1", "u1", **bad), 422, "invalid_request")
    assert_problem(leave(client, "t1", "u%20", order_id="o1"), 422, "invalid_request")
    assert get_team(client, "t1") == before


def test_the_leader_hands_over_and_the_last_one_out_fails_the_team(client: TestClient) -> None:
    make_activity(client, AID, team_size=3)
    open_team(client, AID, "t1", "L")  # no order: leaves without one
    join(client, "t1", "u1", "o1")
    body = assert_ok(leave(client, "t1", "L"), 200)
    assert body["team"]["leader_id"] == "u1" and users(body["team"]) == ["u1"]
    last = assert_ok(leave(client, "t1", "u1", order_id="o1"), 200)
    assert last["left"] is True and last["team"]["status"] == "failed"
    assert_problem(leave(client, "t1", "u1", order_id="o9"), 409, "order_mismatch")
    services = app_services(client)
    changed = portal(client).call(events, services, "team.leader_changed", "team.failed")
    assert [(e["type"], e.get("leader_id"), e.get("reason")) for e in changed] == [
        ("team.leader_changed", "u1", None),
        ("team.failed", None, "abandoned"),
    ]
    assert changed[1]["members"] == []
    team = portal(client).call(_team_row, services, "t1")
    assert (team.leader_id, team.status, team.failed_reason) == ("u1", "failed", "abandoned")


async def _team_row(services: Services, tid: str) -> TeamRow:
    async with services.database.sessions() as session:
        row = await session.get(TeamRow, (AID, tid))
    assert row is not None
    return row


def test_a_formed_team_lists_the_refunded_member_and_a_failed_one_refuses(
    client: TestClient,
) -> None:
    make_activity(client, AID, team_size=2)
    open_team(client, AID, "t1", "L", "oL")
    join(client, "t1", "u1", "o1")  # formed
    held = activity(client)["members"]
    body = assert_ok(leave(client, "t1", "u1", order_id="o1", reason="cancel"), 200)
    assert set(body) == {"team", "refunded"} and body["refunded"] is True
    assert body["team"]["status"] == "formed" and users(body["team"]) == ["L", "u1"]
    refunded = body["team"]["members"][1]
    assert ISO_MS.match(refunded["refunded_at"]) and "refunded_at" not in body["team"]["members"][0]
    assert get_team(client, "t1") == body["team"]
    assert activity(client)["members"] == held - 1
    assert assert_ok(leave(client, "t1", "u1", order_id="o1"), 200) == body
    rows = portal(client).call(member_rows, app_services(client), "t1")
    assert rows["u1"].refunded_at is not None and rows["u1"].left_at is None

    open_team(client, AID, "t2", "L2", "o2")
    app_services(client).clock.advance(86_400)  # its deadline passes: failed
    assert_problem(leave(client, "t2", "L2", order_id="o2"), 409, "team_failed")


def test_dissolve_fails_an_open_team_once_audited(client: TestClient) -> None:
    make_activity(client, AID, team_size=2)
    open_team(client, AID, "t1", "L", "oL")
    assert_ok(lock(client, AID, "t1", "u1"), 201)
    assert_problem(dissolve(client, "t1", SERVICE, reason="scalpers"), 403)
    assert_problem(dissolve(client, "t1"), 422, "invalid_request")  # a reason is required
    assert_problem(dissolve(client, "t1", reason=""), 422, "invalid_request")
    assert get_team(client, "t1")["status"] == "open"

    body = assert_ok(dissolve(client, "t1", reason="scalpers"), 200)
    assert set(body) == {"team", "dissolved"} and body["team"]["status"] == "failed"
    assert body["team"]["locks"] == []
    assert assert_ok(dissolve(client, "t1", reason="again"), 200) == body
    assert_problem(client.get(f"/v1/activities/{AID}/users/u1/lock", headers=SERVICE), 404)
    services = app_services(client)
    failed = portal(client).call(events, services, "team.failed")
    assert [(e["reason"], [m["user_id"] for m in e["members"]]) for e in failed] == [
        ("dissolved", ["L"])
    ]
    audit = assert_ok(client.get("/v1/admin/audit", headers=ADMIN), 200)["entries"]
    dissolves = [e for e in audit if e["action"] == "team.dissolve"]
    assert [(e["target"], e["reason"]) for e in dissolves] == [
        (f"{AID}/t1", "again"),
        (f"{AID}/t1", "scalpers"),
    ]

    open_team(client, AID, "t2", "L2", "o2")
    join(client, "t2", "u2", "o3")  # formed
    assert_problem(dissolve(client, "t2", reason="late"), 409, "team_formed")
    assert_problem(dissolve(client, "t9", reason="x"), 404, "team_not_found")


async def test_a_leave_answers_503_while_sql_is_away_and_its_retry_200(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    teams = services.teams
    await teams.activities.create_activity(AID, team_size=3)
    await teams.activities.open_team(AID, "L", team_id="t1", order_id="oL")
    await teams.seats.lock(AID, "t1", "u1")
    await teams.seats.confirm(AID, "t1", "u1", "o1")
    real_write = services.team_writer._write

    async def away(batch: list[dict[str, str]]) -> None:
        raise DatabaseUnreachable("[Errno 111] Connect call failed")

    monkeypatch.setattr(services.team_writer, "_write", away)
    with pytest.raises(DatabaseUnreachable):
        await teams.seats.leave(AID, "t1", "u1", "o1")
    assert (await member_rows(services, "t1"))["u1"].left_at is None
    monkeypatch.setattr(services.team_writer, "_write", real_write)
    retried = await teams.seats.leave(AID, "t1", "u1", "o1")
    assert retried.get("left") is True and users(dict(retried["team"])) == ["L"]
    assert (await member_rows(services, "t1"))["u1"].left_at is not None


async def test_the_rebuild_from_sql_keeps_who_left_out_and_who_was_refunded_listed(
    services: Services,
) -> None:
    teams = services.teams
    await teams.activities.create_activity(AID, team_size=3)
    await teams.activities.open_team(AID, "L", team_id="t1", order_id="oL")
    for uid in ("u1", "u2"):
        await teams.seats.lock(AID, "t1", uid)
        await teams.seats.confirm(AID, "t1", uid, f"o-{uid}")  # t1 formed
    await teams.seats.leave(AID, "t1", "u1", "o-u1")  # refunded
    await teams.activities.open_team(AID, "L", team_id="t2", order_id="oL2")
    await teams.seats.lock(AID, "t2", "u3")
    await teams.seats.confirm(AID, "t2", "u3", "o-u3")
    await teams.seats.leave(AID, "t2", "L", "oL2")  # u3 leads t2 now
    formed = await teams.activities.get_team(AID, "t1")
    await services.redis.flushall()  # Redis lost everything

    rebuilt = await teams.activities.get_team(AID, "t2")
    assert (rebuilt["leader_id"], users(dict(rebuilt))) == ("u3", ["u3"])
    assert (await teams.seats.leave(AID, "t2", "L", "oL2")).get("left") is True
    with pytest.raises(errors.LeftTeam):
        await teams.seats.lock(AID, "t2", "L")
    await teams.seats.lock(AID, "t2", "u4")
    await teams.seats.confirm(AID, "t2", "u4", "o-u4")  # its seq follows the leaver's
    assert sorted(m.seq for m in (await member_rows(services, "t2")).values()) == [1, 2, 3]
    # A formed team is answered from SQL: the refunded member still listed, refunded.
    assert await teams.activities.get_team(AID, "t1") == formed
    counts = await teams.counts.read(AID)
    assert counts["members"] == 2 + 2  # t1: L, u2 (u1 refunded); t2: u3, u4
    report = await services.reconciler.run()
    assert report["mismatch_count"] == 0, report["mismatches"]
