"""A seat lock still live when its team fails, as docs/concepts.md ("The life of a team")
says it ends: with the team, without an event of its own; the user holds no lock and may
lock another team at once; the failed team shows no lock and `free_seats` 0."""

from __future__ import annotations

from typing import Any

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

AID = "failing"
# The lock outlives the deadline: still live when the team fails at it.
LOCK_TTL_S = 60
DEADLINE_S = 30
PAST_DEADLINE_S = DEADLINE_S + 1


def fail(client: TestClient, how: str) -> None:
    """Fail team t1: its deadline passes (seen by a read), or an admin dissolves it."""
    if how == "deadline":
        app_services(client).clock.advance(PAST_DEADLINE_S)
    else:
        path = f"/v1/admin/activities/{AID}/teams/t1/dissolve"
        assert_ok(client.post(path, json={"reason": "scalpers"}, headers=ADMIN), 200)


def feed(client: TestClient) -> list[dict[str, Any]]:
    """Every event of the feed, once the write-behind has drained."""
    portal(client).call(app_services(client).team_writer.drain_all)
    page = assert_ok(client.get("/v1/events?after=0&limit=1000", headers=SERVICE), 200)
    return list(page["events"])


@pytest.mark.parametrize("how", ["deadline", "dissolved"])
def test_a_lock_live_when_its_team_fails_ends_with_the_team(client: TestClient, how: str) -> None:
    """The lock ends with no event; the user may lock elsewhere at once, nothing released."""
    make_activity(client, AID, team_size=3, lock_ttl_s=LOCK_TTL_S, team_deadline_s=DEADLINE_S)
    open_team(client, AID, "t1", "L", "oL")
    assert_ok(lock(client, AID, "t1", "u1"), 201)
    fail(client, how)

    team = assert_ok(client.get(f"/v1/activities/{AID}/teams/t1", headers=SERVICE), 200)
    assert (team["status"], team["locks"], team["free_seats"]) == ("failed", [], 0)
    assert_problem(client.get(f"/v1/activities/{AID}/users/u1/lock", headers=SERVICE), 404)
    paid = {"user_id": "u1", "order_id": "o1"}
    confirm = client.post(f"/v1/activities/{AID}/teams/t1/members", json=paid, headers=SERVICE)
    assert_problem(confirm, 409, "team_failed")
    open_team(client, AID, "t2", "L2")
    taken = assert_ok(lock(client, AID, "t2", "u1"), 201)
    assert (taken["team_id"], taken["released_team_id"]) == ("t2", None)

    events = feed(client)
    failed = [e["data"] for e in events if e["type"] == "team.failed"]
    assert [(f["team_id"], f["reason"], f["members"]) for f in failed] == [
        ("t1", how, [{"user_id": "L", "order_id": "oL"}])  # the lock holder is no member
    ]
    about_u1 = [
        (e["type"], e["data"]["team_id"]) for e in events if e["data"].get("user_id") == "u1"
    ]
    assert about_u1 == []  # neither lock.expired nor a release: the lock ended with t1
