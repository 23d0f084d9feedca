"""HTTP tests of the activity listing, closing an activity, and the teams listed by status
(SPEC §3 "Activities" and "Teams"), on fakeredis and a real redis-server, SQLite and
PostgreSQL (the `client` fixture)."""

from __future__ import annotations

from typing import Any

import httpx2 as httpx
import pytest
from starlette.testclient import TestClient

from tests.support.http import (
    ADMIN,
    SERVICE,
    app_services,
    assert_ok,
    assert_problem,
    lock,
    make_activity,
    open_team,
    portal,
)


def patch(client: TestClient, aid: str, body: Any, headers: Any = ADMIN) -> httpx.Response:
    return client.patch(f"/v1/activities/{aid}", json=body, headers=headers)


def pages(client: TestClient, url: str) -> list[list[str]]:
    """Every page of a list, following `next_cursor`: the ids of each page."""
    key = "activities" if url.startswith("/v1/activities?") else "teams"
    id_key = "activity_id" if key == "activities" else "team_id"
    seen: list[list[str]] = []
    cursor = None
    while True:
        target = url if cursor is None else f"{url}&cursor={cursor}"
        page = assert_ok(client.get(target, headers=SERVICE), 200)
        assert set(page) == {key, "next_cursor"}
        seen.append([item[id_key] for item in page[key]])
        cursor = page["next_cursor"]
        if cursor is None:
            return seen
        assert len(seen) < 50, "the cursor must move on"


def confirm(client: TestClient, aid: str, tid: str, uid: str) -> Any:
    return client.post(
        f"/v1/activities/{aid}/teams/{tid}/members",
        json={"user_id": uid, "order_id": f"o-{uid}"},
        headers=SERVICE,
    )


def join(client: TestClient, aid: str, uid: str) -> httpx.Response:
    return client.post(f"/v1/activities/{aid}/locks", json={"user_id": uid}, headers=SERVICE)


# -- GET /v1/activities ---------------------------------------------------------------


def test_activities_page_newest_first_without_repeats_or_skips(client: TestClient) -> None:
    made = []
    for i in range(7):
        made.append(make_activity(client, f"act{i}", name=f"sale {i}")["activity_id"])
        app_services(client).clock.advance(0.002)  # distinct created_at, newest last
    assert_ok(patch(client, "act2", {"status": "closed"}), 200)
    assert_ok(patch(client, "act5", {"status": "closed"}), 200)

    everything = pages(client, "/v1/activities?limit=3")
    assert [len(p) for p in everything] == [3, 3, 1]
    assert sum(everything, []) == list(reversed(made))
    assert sum(pages(client, "/v1/activities?status=closed&limit=1"), []) == ["act5", "act2"]
    opened = sum(pages(client, "/v1/activities?status=open&limit=2"), [])
    assert opened == ["act6", "act4", "act3", "act1", "act0"]

    first = assert_ok(client.get("/v1/activities?limit=1", headers=SERVICE), 200)
    one = assert_ok(client.get("/v1/activities/act6", headers=SERVICE), 200)
    assert first["activities"] == [one] and one["status"] == "open"


def test_activities_page_of_nothing_and_same_instant(client: TestClient) -> None:
    empty = assert_ok(client.get("/v1/activities", headers=SERVICE), 200)
    assert empty == {"activities": [], "next_cursor": None}
    for aid in ("b", "a", "c"):  # one Redis millisecond: the id orders them
        make_activity(client, aid)
    listed = sum(pages(client, "/v1/activities?limit=1"), [])
    assert sorted(listed) == ["a", "b", "c"] and len(listed) == 3


def test_activities_page_refuses_bad_queries(client: TestClient) -> None:
    make_activity(client, "a")
    make_activity(client, "b")
    cursor = assert_ok(client.get("/v1/activities?limit=1", headers=SERVICE), 200)["next_cursor"]
    open_cursor = "LTEwfHQx"  # "-10|t1": a cursor of the open-teams list, not of this one
    for query in (
        "limit=0",
        "limit=101",
        "limit=x",
        "status=formed",
        "status=",
        "cursor=",
        "cursor=nonsense",
        f"cursor={cursor}A",
        f"cursor={open_cursor}",
        "foo=1",
        "limit=1&limit=2",
    ):
        assert_problem(client.get(f"/v1/activities?{query}", headers=SERVICE), 422)
    assert_problem(client.get("/v1/activities", headers={}), 401, "unauthorized")
    assert_problem(client.get("/v1/activities", headers={"Authorization": "Bearer x"}), 401)


# -- PATCH /v1/activities/{aid} ---------------------------------------------------------


def test_patch_renames_and_closes_idempotently(client: TestClient) -> None:
    made = make_activity(client, "p", name="old", team_size=3)
    renamed = assert_ok(patch(client, "p", {"name": "new"}), 200)
    assert renamed == {**made, "name": "new"}
    assert assert_ok(patch(client, "p", {}), 200) == renamed
    closed = assert_ok(patch(client, "p", {"status": "closed"}), 200)
    assert closed == {**renamed, "status": "closed"}
    assert assert_ok(patch(client, "p", {"status": "closed"}), 200) == closed
    assert assert_ok(client.get("/v1/activities/p", headers=SERVICE), 200) == closed
    # A closed activity stays closed; a name may still change.
    assert_problem(patch(client, "p", {"status": "open"}), 422, "invalid_request")
    assert assert_ok(patch(client, "p", {"name": "later"}), 200)["status"] == "closed"

    entries = portal(client).call(app_services(client).audit.page, 10)["entries"]
    # Every PATCH answered 2xx is one row (the route writes it, Endpoint.audit); the 422 none.
    updates = [e for e in entries if e["action"] == "activity.update"]
    assert len(updates) == 5, entries
    assert {e["target"] for e in updates} == {"p"}
    assert all(e["actor"].startswith("admin:") and e["reason"] is None for e in updates)
    assert all("admin-secret" not in e["actor"] for e in updates)


def test_patch_refusals_change_nothing(client: TestClient) -> None:
    made = make_activity(client, "p")
    assert_problem(patch(client, "p", {"status": "closed"}, SERVICE), 403, "forbidden")
    assert_problem(patch(client, "p", {"status": "closed"}, {}), 401, "unauthorized")
    assert_problem(patch(client, "nope", {"status": "closed"}), 404, "activity_not_found")
    bodies: list[Any] = [
        {"status": "paused"},
        {"status": None, "extra": 1},
        {"name": 3},
        {"name": "x" * 201},
        {"name": "a\u0000b"},
        [],
        "closed",
    ]
    for body in bodies:
        assert_problem(patch(client, "p", body), 422, "invalid_request")
    r = client.patch("/v1/activities/p", content=b"{", headers={**ADMIN, "content-type": "x/y"})
    assert r.status_code == 415
    assert assert_ok(client.get("/v1/activities/p", headers=SERVICE), 200) == made


def test_a_closed_activity_refuses_opens_locks_and_joins_first(client: TestClient) -> None:
    make_activity(client, "c", team_size=2, limits={"teams_per_user": 1})
    open_team(client, "c", "t1", "L1")
    open_team(client, "c", "t2", "L2")
    assert_ok(lock(client, "c", "t1", "u1"), 201)  # t1 now full
    assert_ok(
        client.put("/v1/admin/blocked-users/bad", json={}, headers=ADMIN), 200
    )  # a blocked user
    assert_ok(patch(client, "c", {"status": "closed"}), 200)

    refused = [
        client.post("/v1/activities/c/teams", json={"leader_id": "L3"}, headers=SERVICE),
        # a repeat of an open that succeeded, a full team, a member, a blocked user, a limit
        client.post(
            "/v1/activities/c/teams", json={"leader_id": "L1", "team_id": "t1"}, headers=SERVICE
        ),
        lock(client, "c", "t1", "u2"),
        lock(client, "c", "t1", "L1"),
        lock(client, "c", "t2", "bad"),
        lock(client, "c", "t2", "L1"),
        join(client, "c", "u3"),
        join(client, "c", "bad"),
    ]
    for r in refused:
        problem = assert_problem(r, 409, "activity_closed")
        assert problem["title"] and problem["detail"] is not None
    # The live lock's confirm runs on: the team forms.
    formed = assert_ok(confirm(client, "c", "t1", "u1"), 201)
    assert formed["formed"] is True and formed["team"]["status"] == "formed"
    assert_problem(lock(client, "nope", "t1", "u1"), 404, "activity_not_found")


# -- GET .../teams?status=formed|failed, has_free_seats=false ----------------------------


def test_formed_and_failed_teams_page_newest_end_first(client: TestClient) -> None:
    services = app_services(client)
    make_activity(client, "h", team_size=2, team_deadline_s=60)
    formed = []
    for i in range(5):
        open_team(client, "h", f"f{i}", f"L{i}")
        assert_ok(lock(client, "h", f"f{i}", f"u{i}"), 201)
        assert_ok(confirm(client, "h", f"f{i}", f"u{i}"), 201)
        formed.append(f"f{i}")
        services.clock.advance(0.002)
    for i in range(3):
        open_team(client, "h", f"x{i}", f"M{i}")
        services.clock.advance(1)  # distinct deadlines: distinct failed_at
    services.clock.advance(60)
    for job in ("expire_teams", "flush_records"):
        assert_ok(client.post(f"/v1/admin/jobs/{job}/run", headers=ADMIN), 200)

    listed = pages(client, "/v1/activities/h/teams?status=formed&limit=2")
    assert [len(p) for p in listed] == [2, 2, 1]
    assert sum(listed, []) == list(reversed(formed))
    failed = sum(pages(client, "/v1/activities/h/teams?status=failed&limit=2"), [])
    assert failed == ["x2", "x1", "x0"]
    page = assert_ok(client.get("/v1/activities/h/teams?status=failed", headers=SERVICE), 200)
    for team in page["teams"]:
        assert team["status"] == "failed" and team["failed_at"] is not None
        assert team == assert_ok(
            client.get(f"/v1/activities/h/teams/{team['team_id']}", headers=SERVICE), 200
        )
    assert_problem(client.get("/v1/activities/no/teams?status=formed", headers=SERVICE), 404)


def test_full_open_teams_page_earliest_deadline_first(client: TestClient) -> None:
    services = app_services(client)
    make_activity(client, "full", team_size=2, lock_ttl_s=60)
    for i in range(5):
        open_team(client, "full", f"t{i}", f"L{i}")
        services.clock.advance(0.002)
    for i in (0, 1, 3, 4):
        assert_ok(lock(client, "full", f"t{i}", f"u{i}"), 201)
    assert_ok(confirm(client, "full", "t4", "u4"), 201)  # formed: not open any more

    listed = pages(client, "/v1/activities/full/teams?has_free_seats=false&limit=2")
    assert sum(listed, []) == ["t0", "t1", "t3"]
    free = sum(pages(client, "/v1/activities/full/teams?has_free_seats=true&limit=2"), [])
    assert free == ["t2"]
    # A lock that expires frees its seat: the team leaves the full list.
    services.clock.advance(61)
    assert sum(pages(client, "/v1/activities/full/teams?has_free_seats=false"), []) == []


@pytest.mark.parametrize("query", ["status=formed&limit=0", "status=failed&cursor=x"])
def test_ended_teams_refuse_bad_queries(client: TestClient, query: str) -> None:
    make_activity(client, "q")
    assert_problem(client.get(f"/v1/activities/q/teams?{query}", headers=SERVICE), 422)
    assert_problem(client.get(f"/v1/activities/q/teams?{query}", headers={}), 401)


# -- the live counts of GET /v1/activities/{id} and of the listing -------------------------


def _counts(body: dict[str, Any]) -> dict[str, int]:
    return {k: body[k] for k in ("teams_open", "teams_formed", "members", "live_locks")}


def test_activity_body_carries_live_counts_the_listing_too(client: TestClient) -> None:
    made = make_activity(client, "live", team_size=2, team_deadline_s=60)
    assert (made["teams_open"], made["members"], made["virtual_completions"]) == (0, 0, 0)
    open_team(client, "live", "t1", "L1")
    open_team(client, "live", "t2", "L2")
    assert_ok(lock(client, "live", "t1", "u1"), 201)
    assert_ok(lock(client, "live", "t2", "u2"), 201)
    one = assert_ok(client.get("/v1/activities/live", headers=SERVICE), 200)
    assert _counts(one) == {"teams_open": 2, "teams_formed": 0, "members": 2, "live_locks": 2}
    assert_ok(confirm(client, "live", "t1", "u1"), 201)  # t1 formed
    one = assert_ok(client.get("/v1/activities/live", headers=SERVICE), 200)
    assert _counts(one) == {"teams_open": 1, "teams_formed": 1, "members": 3, "live_locks": 1}
    listed = assert_ok(client.get("/v1/activities", headers=SERVICE), 200)
    assert listed["activities"] == [one]
    app_services(client).clock.advance(61)  # t2 failed at its deadline, unread since
    one = assert_ok(client.get("/v1/activities/live", headers=SERVICE), 200)
    assert _counts(one) == {"teams_open": 0, "teams_formed": 1, "members": 2, "live_locks": 0}
    assert one["teams_failed"] == 1
    assert_problem(client.get("/v1/activities/nope", headers=SERVICE), 404, "activity_not_found")
    assert_problem(client.get("/v1/activities/live"), 401)
