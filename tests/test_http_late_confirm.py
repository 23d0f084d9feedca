"""HTTP tests of late confirm (SPEC §3 Teams): a confirm without a live lock joins on an
activity with late_confirm while a seat and a stock unit are free, and answers after SQL has
the membership; else 409 lock_required as before. On fakeredis and a real redis-server,
SQLite and PostgreSQL (the `client` fixture)."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
from starlette.testclient import TestClient

from tests.support.http import (
    SERVICE,
    assert_ok,
    assert_problem,
    lock,
    make_activity,
    open_team,
)


def confirm(client: TestClient, aid: str, tid: str, uid: str) -> httpx.Response:
    return client.post(
        f"/v1/activities/{aid}/teams/{tid}/members",
        json={"user_id": uid, "order_id": "o-" + uid},
        headers=SERVICE,
    )


def joined(client: TestClient) -> list[Any]:
    """The member_joined events the feed (SQL) holds, as (team, user, order)."""
    feed = assert_ok(client.get("/v1/events?after=0&limit=1000", headers=SERVICE), 200)
    return [
        (e["data"]["team_id"], e["data"]["user_id"], e["data"]["order_id"])
        for e in feed["events"]
        if e["type"] == "team.member_joined"
    ]


def test_a_late_confirm_joins_and_sql_has_it(client: TestClient) -> None:
    make_activity(client, "late", team_size=3, stock=10, late_confirm=True)
    open_team(client, "late", "t1", "L")
    body = assert_ok(confirm(client, "late", "t1", "u1"), 201)
    assert body["late"] is True and body["formed"] is False
    assert [m["user_id"] for m in body["team"]["members"]] == ["L", "u1"]
    assert ("t1", "u1", "o-u1") in joined(client)
    # A repeat answers 200 the same team; a confirm of a live lock is not late.
    again = assert_ok(confirm(client, "late", "t1", "u1"), 200)
    assert again["team"]["members"] == body["team"]["members"]
    assert_ok(lock(client, "late", "t1", "u2"), 201)
    on_time = assert_ok(confirm(client, "late", "t1", "u2"), 201)
    assert on_time["formed"] is True and "late" not in on_time
    stock = assert_ok(client.get("/v1/activities/late", headers=SERVICE), 200)
    assert (stock["members"], stock["stock_left"]) == (3, 7)


def test_a_full_team_or_no_unit_left_is_lock_required(client: TestClient) -> None:
    make_activity(client, "full", team_size=2, late_confirm=True)
    open_team(client, "full", "t1", "L")
    assert_ok(lock(client, "full", "t1", "u1"), 201)  # members + live locks == size
    assert_problem(confirm(client, "full", "t1", "u2"), 409, "lock_required")

    make_activity(client, "few", team_size=3, stock=2, late_confirm=True)
    open_team(client, "few", "t1", "L")
    open_team(client, "few", "t2", "M")  # both units held
    before = assert_ok(client.get("/v1/activities/few", headers=SERVICE), 200)
    assert_problem(confirm(client, "few", "t1", "u1"), 409, "lock_required")
    assert assert_ok(client.get("/v1/activities/few", headers=SERVICE), 200) == before
    assert joined(client) == []


def test_without_late_confirm_no_lock_is_lock_required(client: TestClient) -> None:
    make_activity(client, "plain", team_size=3)
    open_team(client, "plain", "t1", "L")
    assert_problem(confirm(client, "plain", "t1", "u1"), 409, "lock_required")
    team = assert_ok(client.get("/v1/activities/plain/teams/t1", headers=SERVICE), 200)
    assert [m["user_id"] for m in team["members"]] == ["L"]
