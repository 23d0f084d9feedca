"""HTTP tests of a seat lock's extension (PATCH .../locks/{user_id}, SPEC §3 Teams), on
fakeredis and a real redis-server, SQLite and PostgreSQL (the `client` fixture)."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
from starlette.testclient import TestClient

from tests.support.fixtures import OpenTeam
from tests.support.http import (
    ADMIN,
    SERVICE,
    app_services,
    assert_ok,
    assert_problem,
    lock,
    ms,
)

TTL_S = 30


def extend(client: TestClient, tid: str, uid: str, body: Any, aid: str = "a") -> httpx.Response:
    return client.patch(f"/v1/activities/{aid}/teams/{tid}/locks/{uid}", json=body, headers=SERVICE)


def get_team(client: TestClient, tid: str = "t1") -> Any:
    return assert_ok(client.get(f"/v1/activities/a/teams/{tid}", headers=SERVICE), 200)


def test_extend_200_moves_the_expiry_once(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team(team_size=2, lock_ttl_s=TTL_S, max_hold_s=3 * TTL_S)
    held = assert_ok(lock(client, "a", "t1", "u1"), 201)
    before = get_team(client)
    body = assert_ok(extend(client, "t1", "u1", {"hold_s": 2 * TTL_S}), 200)
    assert body == {
        **held,
        "expires_at": body["expires_at"],
        "version": before["version"] + 1,
    }
    assert ms(body["expires_at"]) == ms(held["locked_at"]) + 2 * TTL_S * 1000
    # A repeat and a shorter hold answer the same and change nothing.
    assert assert_ok(extend(client, "t1", "u1", {"hold_s": 2 * TTL_S}), 200) == body
    assert assert_ok(extend(client, "t1", "u1", {"hold_s": TTL_S}), 200) == body
    team = get_team(client)
    assert team["version"] == body["version"]
    assert team["locks"] == [
        {"user_id": "u1", "locked_at": held["locked_at"], "expires_at": body["expires_at"]}
    ]
    assert team["next_unlock_at"] == body["expires_at"]
    current = client.get("/v1/activities/a/users/u1/lock", headers=SERVICE)
    assert assert_ok(current, 200)["expires_at"] == body["expires_at"]
    # Past the old expiry the seat is still held; a confirm then joins.
    app_services(client).clock.advance(TTL_S + 1)
    full = assert_problem(lock(client, "a", "t1", "u2"), 409, "team_full")
    assert full["next_unlock_at"] == body["expires_at"]
    confirmed = client.post(
        "/v1/activities/a/teams/t1/members",
        json={"user_id": "u1", "order_id": "o1"},
        headers=SERVICE,
    )
    assert assert_ok(confirmed, 201)["formed"] is True


def test_extend_event_reaches_the_feed(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team(lock_ttl_s=TTL_S, max_hold_s=2 * TTL_S)
    held = assert_ok(lock(client, "a", "t1", "u1"), 201)
    body = assert_ok(extend(client, "t1", "u1", {"hold_s": 2 * TTL_S}), 200)
    ran = client.post("/v1/admin/jobs/flush_records/run", headers=ADMIN)
    assert_ok(ran, 200)
    events = assert_ok(client.get("/v1/events?after=0", headers=SERVICE), 200)["events"]
    assert [e["type"] for e in events] == ["team.opened", "lock.extended"]
    assert events[1]["data"] == {
        "activity_id": "a",
        "team_id": "t1",
        "user_id": "u1",
        "locked_at": held["locked_at"],
        "expires_at": body["expires_at"],
        "version": body["version"],
    }


def test_extend_422_bounds_and_bad_bodies_change_nothing(
    client: TestClient, opened_team: OpenTeam
) -> None:
    # No max_hold_s: the lock's ttl is the only hold.
    opened_team("b", lock_ttl_s=TTL_S)
    assert_ok(lock(client, "b", "t1", "u1"), 201)
    refused = assert_problem(extend(client, "t1", "u1", {"hold_s": TTL_S + 1}, aid="b"), 422)
    assert refused["code"] == "invalid_request"
    assert (refused["min_hold_s"], refused["max_hold_s"]) == (TTL_S, TTL_S)
    opened_team(lock_ttl_s=TTL_S, max_hold_s=2 * TTL_S)
    assert_ok(lock(client, "a", "t1", "u1"), 201)
    before = get_team(client)
    bodies: list[Any] = [
        {"hold_s": TTL_S - 1},
        {"hold_s": 2 * TTL_S + 1},
        {"hold_s": 0},
        {"hold_s": 86401},
        {"hold_s": "60"},
        {"hold_s": 60.0},
        {"hold_s": None},
        {"hold_s": 60, "extra": 1},
        {},
        [],
    ]
    for body in bodies:
        assert_problem(extend(client, "t1", "u1", body), 422, "invalid_request")
    assert_problem(extend(client, "t1", "bad id", {"hold_s": 60}), 422, "invalid_request")
    assert get_team(client) == before


def test_extend_409_without_a_live_lock_and_404s(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team(team_size=2, lock_ttl_s=TTL_S, max_hold_s=2 * TTL_S)
    hold = {"hold_s": 2 * TTL_S}
    assert_problem(extend(client, "t1", "u1", hold), 409, "lock_required")
    assert_ok(lock(client, "a", "t1", "u1"), 201)
    app_services(client).clock.advance(TTL_S)
    assert_problem(extend(client, "t1", "u1", hold), 409, "lock_required")  # expired
    assert_problem(extend(client, "t404", "u1", hold), 404, "team_not_found")
    assert_problem(extend(client, "t1", "u1", hold, aid="b"), 404, "activity_not_found")
