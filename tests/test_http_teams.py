"""HTTP tests of activities, teams, seat locks, membership and the events feed (SPEC §3).

Every test runs on fakeredis and on a real redis-server (the `client` fixture).
Time moves with `services.clock.advance(s)`, which shifts the clock the Lua
scripts see, so lock expiry and team deadlines are tested without sleeping.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx2 as httpx
import pytest
from groupbuy_client.wire import LockTaken
from starlette.testclient import TestClient

from groupbuy.storage.clock import RedisClock
from tests.support.backends import ALL
from tests.support.fixtures import OpenTeam
from tests.support.http import (
    ADMIN,
    SERVICE,
    app_services,
    assert_ok,
    assert_problem,
    lock,
    make_activity,
    ms,
    open_team,
    portal,
)

# Also on a 3-master Redis Cluster.
pytestmark = pytest.mark.parametrize("backend", ALL)


ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

TEAM_KEYS = {
    "activity_id",
    "team_id",
    "leader_id",
    "status",
    "size",
    "members",
    "locks",
    "free_seats",
    "next_unlock_at",
    "deadline_at",
    "formed_at",
    "failed_at",
    "virtual_seats",
    "version",
}
MEMBER_KEYS = {"user_id", "order_id", "joined_at"}
LOCK_KEYS = {"user_id", "locked_at", "expires_at"}
NEW_LOCK_KEYS = set(LockTaken.__required_keys__)  # a new lock's answer is its wire shape
ACTIVITY_KEYS = {
    "activity_id",
    "name",
    "team_size",
    "lock_ttl_s",
    "team_deadline_s",
    "virtual_completion",
    "limits",
    "created_at",
    "status",
    "max_hold_s",
    "late_confirm",
    "waitlist",
    "waiting",
    "waiting_any_team",
    "oldest_waiting_since",
    "teams_open",
    "teams_formed",
    "teams_failed",
    "members",
    "live_locks",
    "virtual_completions",
}


# -- helpers ------------------------------------------------------------------------


def clock(client: TestClient) -> RedisClock:
    return app_services(client).clock


def confirm(client: TestClient, aid: str, tid: str, uid: str, order: str) -> httpx.Response:
    return client.post(
        f"/v1/activities/{aid}/teams/{tid}/members",
        json={"user_id": uid, "order_id": order},
        headers=SERVICE,
    )


def unlock(client: TestClient, aid: str, tid: str, uid: str) -> httpx.Response:
    return client.delete(f"/v1/activities/{aid}/teams/{tid}/locks/{uid}", headers=SERVICE)


def get_team(client: TestClient, aid: str, tid: str) -> Any:
    team = assert_ok(client.get(f"/v1/activities/{aid}/teams/{tid}", headers=SERVICE), 200)
    check_team_shape(team)
    return team


def user_lock(client: TestClient, aid: str, uid: str) -> httpx.Response:
    return client.get(f"/v1/activities/{aid}/users/{uid}/lock", headers=SERVICE)


def check_team_shape(team: dict[str, Any]) -> None:
    """The team body of SPEC §3, with its invariants."""
    assert set(team) == TEAM_KEYS, team
    assert team["status"] in ("open", "formed", "failed")
    assert isinstance(team["size"], int) and isinstance(team["free_seats"], int)
    for member in team["members"]:
        assert set(member) == MEMBER_KEYS, member
        ms(member["joined_at"])
    for held in team["locks"]:
        assert set(held) == LOCK_KEYS, held
        assert ms(held["expires_at"]) > ms(held["locked_at"])
    ms(team["deadline_at"])
    for key in ("formed_at", "failed_at", "next_unlock_at"):
        if team[key] is not None:
            ms(team[key])
    users = [m["user_id"] for m in team["members"]]
    assert len(users) == len(set(users)), "nobody is a member twice"
    assert team["members"][0]["user_id"] == team["leader_id"], "the leader is member 1"
    if team["status"] == "open":
        assert len(team["members"]) + len(team["locks"]) + team["free_seats"] == team["size"], team
        assert team["formed_at"] is None and team["failed_at"] is None
        expiries = [ms(held["expires_at"]) for held in team["locks"]]
        if expiries:
            assert ms(team["next_unlock_at"]) == min(expiries)
        else:
            assert team["next_unlock_at"] is None
    else:
        assert team["locks"] == [] and team["free_seats"] == 0, team
    if team["status"] == "formed":
        assert len(team["members"]) == team["size"] and team["formed_at"] is not None
    if team["status"] == "failed":
        assert team["failed_at"] is not None and team["formed_at"] is None


def wait_events(client: TestClient, count: int, timeout_s: float = 10.0) -> Any:
    """The feed once it holds at least `count` events (the background writer is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while True:
        page = assert_ok(client.get("/v1/events?after=0&limit=1000", headers=SERVICE), 200)
        if len(page["events"]) >= count or time.monotonic() > deadline:
            return page["events"]
        time.sleep(0.02)


# -- activities ---------------------------------------------------------------------


def test_create_activity_201_repeat_200_other_params_409(client: TestClient) -> None:
    params = {
        "activity_id": "act-1",
        "name": "Flash sale",
        "team_size": 5,
        "lock_ttl_s": 120,
        "team_deadline_s": 3600,
    }
    r = client.post("/v1/activities", json=params, headers=ADMIN)
    created = assert_ok(r, 201)
    assert set(created) == ACTIVITY_KEYS
    assert {k: created[k] for k in params} == params
    ms(created["created_at"])

    again = assert_ok(client.post("/v1/activities", json=params, headers=ADMIN), 200)
    assert again == created

    for change in (
        {"name": "Other"},
        {"name": None},
        {"team_size": 4},
        {"lock_ttl_s": 121},
        {"team_deadline_s": 3601},
    ):
        r = client.post("/v1/activities", json={**params, **change}, headers=ADMIN)
        assert_problem(r, 409, "conflict")
    # Omitting the numbers means the defaults (3/300/86400), which differ from the original.
    r = client.post(
        "/v1/activities", json={"activity_id": "act-1", "name": "Flash sale"}, headers=ADMIN
    )
    assert_problem(r, 409, "conflict")

    assert assert_ok(client.get("/v1/activities/act-1", headers=SERVICE), 200) == created


def test_an_activity_name_is_any_text_but_nul(client: TestClient) -> None:
    """A name is kept as written (accents, CJK, emoji, a tab); U+0000, which PostgreSQL's
    text types cannot hold, is a 422 on every database and no activity is made."""
    name = "Café 限时团购 🎉\tday 1"
    created = assert_ok(
        client.post("/v1/activities", json={"activity_id": "a1", "name": name}, headers=ADMIN), 201
    )
    assert created["name"] == name
    refused = client.post(
        "/v1/activities", json={"activity_id": "a2", "name": "flash\u0000sale"}, headers=ADMIN
    )
    assert_problem(refused, 422, "invalid_request")
    assert_problem(client.get("/v1/activities/a2", headers=SERVICE), 404)


def test_create_activity_defaults(client: TestClient) -> None:
    created = make_activity(client, "defaults")
    assert created["team_size"] == 3
    assert created["lock_ttl_s"] == 300
    assert created["team_deadline_s"] == 86400
    assert created["name"] is None
    assert set(created) == ACTIVITY_KEYS

    # The defaults really apply to teams and locks of the activity.
    team = open_team(client, "defaults", "t1", "leader")
    assert team["size"] == 3 and team["free_seats"] == 2
    assert ms(team["deadline_at"]) - ms(team["members"][0]["joined_at"]) == 86400 * 1000
    held = assert_ok(lock(client, "defaults", "t1", "u1"), 201)
    assert ms(held["expires_at"]) - ms(held["locked_at"]) == 300 * 1000

    # The same id with the defaults spelled out is the same activity.
    r = client.post(
        "/v1/activities",
        json={
            "activity_id": "defaults",
            "team_size": 3,
            "lock_ttl_s": 300,
            "team_deadline_s": 86400,
        },
        headers=ADMIN,
    )
    # The same activity, its live counts now: the team opened and the lock held above.
    now = {"teams_open": 1, "members": 1, "live_locks": 1}
    assert assert_ok(r, 200) == {**created, **now}


def test_get_activity_200_and_404(client: TestClient) -> None:
    created = make_activity(client, "known", team_size=2)
    assert assert_ok(client.get("/v1/activities/known", headers=SERVICE), 200) == created
    body = assert_problem(
        client.get("/v1/activities/unknown", headers=SERVICE), 404, "activity_not_found"
    )
    assert "unknown" in body["detail"]
    # A refused (403) create does not bring it into being either.
    r = client.post("/v1/activities", json={"activity_id": "unknown"}, headers=SERVICE)
    assert_problem(r, 403, "forbidden")
    assert_problem(client.get("/v1/activities/unknown", headers=SERVICE), 404, "activity_not_found")


# -- teams --------------------------------------------------------------------------


def test_open_team_generates_id_and_leader_is_member_1(client: TestClient) -> None:
    make_activity(client, "a", team_size=4, team_deadline_s=600)
    team = open_team(client, "a", None, "leader-1", order="order-L")
    check_team_shape(team)
    assert ID_RE.match(team["team_id"])
    assert team["activity_id"] == "a" and team["leader_id"] == "leader-1"
    assert team["status"] == "open" and team["size"] == 4 and team["free_seats"] == 3
    assert [(m["user_id"], m["order_id"]) for m in team["members"]] == [("leader-1", "order-L")]
    assert team["locks"] == [] and team["next_unlock_at"] is None
    assert ms(team["deadline_at"]) - ms(team["members"][0]["joined_at"]) == 600 * 1000
    assert get_team(client, "a", team["team_id"]) == team

    other = open_team(client, "a", None, "leader-1", order="order-L")
    assert other["team_id"] != team["team_id"], "each open without team_id makes a new team"

    no_order = open_team(client, "a", "t-no-order", "leader-2")
    assert no_order["members"] == [
        {"user_id": "leader-2", "order_id": None, "joined_at": no_order["members"][0]["joined_at"]}
    ]


def test_open_team_repeat_200_and_conflicts_409(client: TestClient) -> None:
    make_activity(client, "a")
    url = "/v1/activities/a/teams"
    team = open_team(client, "a", "t1", "leader", order="o1")

    again = client.post(
        url, json={"leader_id": "leader", "team_id": "t1", "order_id": "o1"}, headers=SERVICE
    )
    assert assert_ok(again, 200) == team

    for body in (
        {"leader_id": "someone-else", "team_id": "t1", "order_id": "o1"},
        {"leader_id": "someone-else", "team_id": "t1"},
        {"leader_id": "leader", "team_id": "t1", "order_id": "o2"},
        {"leader_id": "leader", "team_id": "t1"},
    ):
        assert_problem(client.post(url, json=body, headers=SERVICE), 409, "conflict")
    assert get_team(client, "a", "t1") == team


def test_open_team_unknown_activity_404(client: TestClient) -> None:
    r = client.post(
        "/v1/activities/nope/teams", json={"leader_id": "l", "team_id": "t1"}, headers=SERVICE
    )
    assert_problem(r, 404, "activity_not_found")
    assert_problem(
        client.get("/v1/activities/nope/teams/t1", headers=SERVICE), 404, "activity_not_found"
    )
    assert_problem(client.get("/v1/activities/nope", headers=SERVICE), 404, "activity_not_found")


def test_get_team_body_shape_and_seat_arithmetic(client: TestClient, opened_team: OpenTeam) -> None:
    opened = opened_team(
        "a", "t1", "L", order_id="oL", team_size=5, lock_ttl_s=100, team_deadline_s=1000
    )
    assert get_team(client, "a", "t1") == opened

    first = assert_ok(lock(client, "a", "t1", "u1"), 201)
    clock(client).advance(2)
    second = assert_ok(lock(client, "a", "t1", "u2"), 201)
    clock(client).advance(2)
    assert_ok(lock(client, "a", "t1", "u3"), 201)
    assert_ok(confirm(client, "a", "t1", "u3", "o3"), 201)

    team = get_team(client, "a", "t1")
    assert team["status"] == "open" and team["size"] == 5
    assert [m["user_id"] for m in team["members"]] == ["L", "u3"]
    assert [m["order_id"] for m in team["members"]] == ["oL", "o3"]
    assert team["locks"] == [
        {"user_id": "u1", "locked_at": first["locked_at"], "expires_at": first["expires_at"]},
        {"user_id": "u2", "locked_at": second["locked_at"], "expires_at": second["expires_at"]},
    ]
    assert team["free_seats"] == 1
    assert team["next_unlock_at"] == first["expires_at"]
    assert team["deadline_at"] == opened["deadline_at"]
    assert team["formed_at"] is None and team["failed_at"] is None


def test_get_team_404_team_not_found_vs_activity_not_found(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("a", "t1", "L")
    body = assert_problem(
        client.get("/v1/activities/a/teams/t2", headers=SERVICE), 404, "team_not_found"
    )
    assert "t2" in body["detail"]
    assert_problem(
        client.get("/v1/activities/b/teams/t1", headers=SERVICE), 404, "activity_not_found"
    )


# -- seat locks ---------------------------------------------------------------------


def test_lock_201_then_existing_200_unchanged(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("a", "t1", "L", lock_ttl_s=120)
    held = assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert set(held) == NEW_LOCK_KEYS
    assert held["status"] == "locked" and held["user_id"] == "u1" and held["team_id"] == "t1"
    assert held["released_team_id"] is None
    assert ms(held["expires_at"]) - ms(held["locked_at"]) == 120 * 1000

    clock(client).advance(30)
    again = assert_ok(lock(client, "a", "t1", "u1"), 200)
    assert again == {**held, "existing": True}, (
        "an existing lock is returned unchanged, not extended"
    )

    team = get_team(client, "a", "t1")
    assert team["locks"] == [
        {"user_id": "u1", "locked_at": held["locked_at"], "expires_at": held["expires_at"]}
    ]
    assert team["free_seats"] == 1
    mine = assert_ok(user_lock(client, "a", "u1"), 200)
    assert mine == {
        "team_id": "t1",
        "locked_at": held["locked_at"],
        "expires_at": held["expires_at"],
    }


def test_lock_team_full_409_names_earliest_lock(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("a", "t1", "L", team_size=3, lock_ttl_s=60)
    first = assert_ok(lock(client, "a", "t1", "u1"), 201)
    clock(client).advance(5)
    second = assert_ok(lock(client, "a", "t1", "u2"), 201)
    before = get_team(client, "a", "t1")
    assert before["free_seats"] == 0

    body = assert_problem(lock(client, "a", "t1", "u3"), 409, "team_full")
    assert body["next_unlock_at"] == first["expires_at"]
    assert body["earliest_locked_at"] == first["locked_at"]
    assert get_team(client, "a", "t1") == before
    assert_problem(user_lock(client, "a", "u3"), 404, "no_lock")

    # Once the earliest lock expires its seat is free again (the second lock still holds).
    clock(client).advance(56)
    third = assert_ok(lock(client, "a", "t1", "u3"), 201)
    team = get_team(client, "a", "t1")
    assert [held["user_id"] for held in team["locks"]] == ["u2", "u3"]
    assert team["next_unlock_at"] == second["expires_at"]
    body = assert_problem(lock(client, "a", "t1", "u4"), 409, "team_full")
    assert body["next_unlock_at"] == second["expires_at"]
    assert body["earliest_locked_at"] == second["locked_at"]
    assert ms(third["locked_at"]) > ms(second["locked_at"])


def test_lock_when_every_seat_is_a_member(client: TestClient, opened_team: OpenTeam) -> None:
    """Seats that are all members (team_size 2 and a confirm): the team is formed, no lock fits."""
    opened_team("a", "t1", "L", team_size=2)
    held = assert_ok(lock(client, "a", "t1", "u1"), 201)
    body = assert_problem(lock(client, "a", "t1", "u2"), 409, "team_full")
    assert body["next_unlock_at"] == held["expires_at"]
    assert body["earliest_locked_at"] == held["locked_at"]

    assert assert_ok(confirm(client, "a", "t1", "u1", "o1"), 201)["formed"] is True
    formed = get_team(client, "a", "t1")
    body = assert_problem(lock(client, "a", "t1", "u2"), 409, "team_formed")
    assert "next_unlock_at" not in body
    assert get_team(client, "a", "t1") == formed
    assert_problem(user_lock(client, "a", "u2"), 404, "no_lock")


def test_team_full_without_locks_has_null_next_unlock(
    client: TestClient, opened_team: OpenTeam
) -> None:
    """team_full's `next_unlock_at` is null when no lock holds a seat (only members do).

    An open team whose seats are all members is not reachable through the API (the
    last confirm forms it), so this puts the team hash in that state directly.
    """
    opened_team("a", "t1", "L", team_size=2)
    services = app_services(client)
    portal(client).call(services.redis.hset, services.keys.team("a", "t1"), "member_count", "2")

    body = assert_problem(lock(client, "a", "t1", "u1"), 409, "team_full")
    assert body["next_unlock_at"] is None
    assert body["earliest_locked_at"] is None
    assert_problem(user_lock(client, "a", "u1"), 404, "no_lock")


def test_lock_in_other_team_releases_the_old_lock(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("a", "t1", "L1", team_size=3)
    open_team(client, "a", "t2", "L2")
    old = assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert assert_ok(user_lock(client, "a", "u1"), 200)["team_id"] == "t1"
    assert get_team(client, "a", "t1")["free_seats"] == 1

    clock(client).advance(1)
    new = assert_ok(lock(client, "a", "t2", "u1"), 201)
    assert new["team_id"] == "t2" and new["released_team_id"] == "t1"
    assert ms(new["locked_at"]) > ms(old["locked_at"])

    t1 = get_team(client, "a", "t1")
    assert t1["locks"] == [] and t1["free_seats"] == 2 and t1["next_unlock_at"] is None
    t2 = get_team(client, "a", "t2")
    assert [held["user_id"] for held in t2["locks"]] == ["u1"] and t2["free_seats"] == 1
    mine = assert_ok(user_lock(client, "a", "u1"), 200)
    assert mine == {"team_id": "t2", "locked_at": new["locked_at"], "expires_at": new["expires_at"]}

    # The old lock is gone: releasing it does nothing and leaves the new one alone.
    assert assert_ok(unlock(client, "a", "t1", "u1"), 200) == {"released": False}
    assert assert_ok(user_lock(client, "a", "u1"), 200)["team_id"] == "t2"

    # And back again.
    back = assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert back["released_team_id"] == "t2"
    assert get_team(client, "a", "t2")["locks"] == []
    assert assert_ok(user_lock(client, "a", "u1"), 200)["team_id"] == "t1"

    # Locks in another activity are independent.
    opened_team("b", "t1", "L1")
    elsewhere = assert_ok(lock(client, "b", "t1", "u1"), 201)
    assert elsewhere["released_team_id"] is None
    assert assert_ok(user_lock(client, "a", "u1"), 200)["team_id"] == "t1"


def test_lock_refused_in_full_team_keeps_the_old_lock(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("a", "t1", "L1", team_size=2)
    open_team(client, "a", "t2", "L2")
    mine = assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert_ok(lock(client, "a", "t2", "u2"), 201)

    assert_problem(lock(client, "a", "t2", "u1"), 409, "team_full")
    assert [held["user_id"] for held in get_team(client, "a", "t1")["locks"]] == ["u1"]
    current = assert_ok(user_lock(client, "a", "u1"), 200)
    assert current == {
        "team_id": "t1",
        "locked_at": mine["locked_at"],
        "expires_at": mine["expires_at"],
    }


def test_lock_already_member_409(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("a", "t1", "L", order_id="oL", team_size=4)
    assert_problem(lock(client, "a", "t1", "L"), 409, "already_member")
    assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert_ok(confirm(client, "a", "t1", "u1", "o1"), 201)
    before = get_team(client, "a", "t1")
    assert_problem(lock(client, "a", "t1", "u1"), 409, "already_member")
    assert get_team(client, "a", "t1") == before
    assert before["locks"] == [] and before["free_seats"] == 2


def test_lock_after_deadline_fails_the_team_409(client: TestClient, opened_team: OpenTeam) -> None:
    opened = opened_team(
        "a", "t1", "L", order_id="oL", team_size=3, lock_ttl_s=300, team_deadline_s=60
    )
    held = assert_ok(lock(client, "a", "t1", "u1"), 201)

    clock(client).advance(61)
    assert_problem(lock(client, "a", "t1", "u2"), 409, "team_failed")

    team = get_team(client, "a", "t1")
    assert team["status"] == "failed"
    assert team["failed_at"] == opened["deadline_at"]
    assert team["locks"] == [] and team["free_seats"] == 0 and team["next_unlock_at"] is None
    assert team["members"] == opened["members"]
    # The lock u1 held when the team failed is gone everywhere.
    assert ms(held["expires_at"]) > ms(opened["deadline_at"])
    assert_problem(user_lock(client, "a", "u1"), 404, "no_lock")
    assert_problem(confirm(client, "a", "t1", "u1", "o1"), 409, "team_failed")
    assert assert_ok(unlock(client, "a", "t1", "u1"), 200) == {"released": False}
    assert_problem(lock(client, "a", "t1", "u1"), 409, "team_failed")
    assert get_team(client, "a", "t1") == team


def test_lazy_failure_is_visible_on_get_team(client: TestClient, opened_team: OpenTeam) -> None:
    opened = opened_team("a", "t1", "L", team_size=3, team_deadline_s=120)
    assert_ok(lock(client, "a", "t1", "u1"), 201)
    clock(client).advance(119)
    assert get_team(client, "a", "t1")["status"] == "open"
    clock(client).advance(2)
    team = get_team(client, "a", "t1")
    assert team["status"] == "failed"
    assert team["failed_at"] == opened["deadline_at"] and team["formed_at"] is None
    assert team["locks"] == [] and team["free_seats"] == 0
    assert get_team(client, "a", "t1") == team, "failing is done once"


def test_expired_lock_disappears_and_frees_the_seat(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("a", "t1", "L", team_size=2, lock_ttl_s=30)
    held = assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert_problem(lock(client, "a", "t1", "u2"), 409, "team_full")

    clock(client).advance(29)
    assert [h["user_id"] for h in get_team(client, "a", "t1")["locks"]] == ["u1"]
    clock(client).advance(2)
    team = get_team(client, "a", "t1")
    assert team["locks"] == [] and team["free_seats"] == 1 and team["next_unlock_at"] is None
    assert_problem(user_lock(client, "a", "u1"), 404, "no_lock")
    assert assert_ok(unlock(client, "a", "t1", "u1"), 200) == {"released": False}
    assert_problem(confirm(client, "a", "t1", "u1", "o1"), 409, "lock_required")

    # The freed seat can be locked by someone else.
    other = assert_ok(lock(client, "a", "t1", "u2"), 201)
    assert other["released_team_id"] is None
    assert ms(other["locked_at"]) >= ms(held["expires_at"])


def test_delete_lock_released_true_then_false(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("a", "t1", "L")
    assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert_ok(lock(client, "a", "t1", "u2"), 201)

    assert assert_ok(unlock(client, "a", "t1", "u1"), 200) == {"released": True}
    team = get_team(client, "a", "t1")
    assert [h["user_id"] for h in team["locks"]] == ["u2"] and team["free_seats"] == 1
    assert_problem(user_lock(client, "a", "u1"), 404, "no_lock")
    assert assert_ok(unlock(client, "a", "t1", "u1"), 200) == {"released": False}
    assert assert_ok(unlock(client, "a", "t1", "never-locked"), 200) == {"released": False}
    assert get_team(client, "a", "t1") == team
    assert_problem(confirm(client, "a", "t1", "u1", "o1"), 409, "lock_required")

    assert_problem(unlock(client, "a", "t404", "u2"), 404, "team_not_found")
    assert_problem(unlock(client, "b", "t1", "u2"), 404, "activity_not_found")
    assert [h["user_id"] for h in get_team(client, "a", "t1")["locks"]] == ["u2"]


def test_lock_404s(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("a", "t1", "L")
    assert_problem(lock(client, "a", "t2", "u1"), 404, "team_not_found")
    assert_problem(lock(client, "b", "t1", "u1"), 404, "activity_not_found")
    assert_problem(user_lock(client, "a", "u1"), 404, "no_lock")
    assert_problem(user_lock(client, "b", "u1"), 404, "activity_not_found")


# -- membership ---------------------------------------------------------------------


def test_confirm_joins_then_forms_the_team(client: TestClient, opened_team: OpenTeam) -> None:
    opened = opened_team("a", "t1", "L", order_id="oL", team_size=3)
    assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert_ok(lock(client, "a", "t1", "u2"), 201)

    r = confirm(client, "a", "t1", "u1", "o1")
    first = assert_ok(r, 201)
    assert set(first) == {"team", "formed"} and first["formed"] is False
    check_team_shape(first["team"])
    assert first["team"]["status"] == "open"
    assert [(m["user_id"], m["order_id"]) for m in first["team"]["members"]] == [
        ("L", "oL"),
        ("u1", "o1"),
    ]
    assert [h["user_id"] for h in first["team"]["locks"]] == ["u2"]
    assert first["team"]["free_seats"] == 0
    assert_problem(user_lock(client, "a", "u1"), 404, "no_lock")
    assert assert_ok(confirm(client, "a", "t1", "u1", "o1"), 200) == first

    clock(client).advance(1)
    second = assert_ok(confirm(client, "a", "t1", "u2", "o2"), 201)
    assert second["formed"] is True
    team = second["team"]
    check_team_shape(team)
    assert team["status"] == "formed" and team["free_seats"] == 0 and team["locks"] == []
    assert team["next_unlock_at"] is None and team["failed_at"] is None
    assert [(m["user_id"], m["order_id"]) for m in team["members"]] == [
        ("L", "oL"),
        ("u1", "o1"),
        ("u2", "o2"),
    ]
    assert team["formed_at"] == team["members"][-1]["joined_at"]
    assert team["deadline_at"] == opened["deadline_at"]
    assert get_team(client, "a", "t1") == team
    assert assert_ok(confirm(client, "a", "t1", "u2", "o2"), 200) == second
    assert_problem(user_lock(client, "a", "u2"), 404, "no_lock")

    # A formed team outlives its deadline: it does not fail.
    clock(client).advance(86400 + 5)
    assert get_team(client, "a", "t1") == team
    assert_problem(confirm(client, "a", "t1", "u3", "o3"), 409, "team_formed")
    assert_problem(lock(client, "a", "t1", "u3"), 409, "team_formed")


def test_confirm_lock_required_409(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("a", "t1", "L", team_size=3, lock_ttl_s=60)
    open_team(client, "a", "t2", "L2")
    before = get_team(client, "a", "t1")

    assert_problem(confirm(client, "a", "t1", "u1", "o1"), 409, "lock_required")
    assert get_team(client, "a", "t1") == before

    # A lock on another team does not count.
    assert_ok(lock(client, "a", "t2", "u1"), 201)
    assert_problem(confirm(client, "a", "t1", "u1", "o1"), 409, "lock_required")
    assert get_team(client, "a", "t1") == before
    assert assert_ok(user_lock(client, "a", "u1"), 200)["team_id"] == "t2"

    # An expired lock does not count either.
    assert_ok(lock(client, "a", "t1", "u2"), 201)
    clock(client).advance(61)
    assert_problem(confirm(client, "a", "t1", "u2", "o2"), 409, "lock_required")
    after = get_team(client, "a", "t1")
    assert [m["user_id"] for m in after["members"]] == ["L"] and after["locks"] == []
    assert after["free_seats"] == 2


def test_confirm_same_user_other_order_409_already_member(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("a", "t1", "L", order_id="oL", team_size=3)
    assert_ok(lock(client, "a", "t1", "u1"), 201)
    assert_ok(confirm(client, "a", "t1", "u1", "o1"), 201)
    before = get_team(client, "a", "t1")

    assert_problem(confirm(client, "a", "t1", "u1", "o-other"), 409, "already_member")
    assert_problem(confirm(client, "a", "t1", "L", "o-other"), 409, "already_member")
    assert get_team(client, "a", "t1") == before
    assert [m["order_id"] for m in before["members"]] == ["oL", "o1"]
    # The leader repeating their own order is the same membership.
    leader = assert_ok(confirm(client, "a", "t1", "L", "oL"), 200)
    assert leader == {"team": before, "formed": False}


def test_confirm_404s(client: TestClient) -> None:
    make_activity(client, "a")
    assert_problem(confirm(client, "a", "t1", "u1", "o1"), 404, "team_not_found")
    assert_problem(confirm(client, "b", "t1", "u1", "o1"), 404, "activity_not_found")


def test_user_lock_200_and_404(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("a", "t1", "L", lock_ttl_s=50)
    assert_problem(user_lock(client, "a", "u1"), 404, "no_lock")
    held = assert_ok(lock(client, "a", "t1", "u1"), 201)
    body = assert_ok(user_lock(client, "a", "u1"), 200)
    assert body == {
        "team_id": "t1",
        "locked_at": held["locked_at"],
        "expires_at": held["expires_at"],
    }
    clock(client).advance(49)
    assert assert_ok(user_lock(client, "a", "u1"), 200) == body
    clock(client).advance(2)
    assert_problem(user_lock(client, "a", "u1"), 404, "no_lock")


# -- joining any team, and the list of open teams -------------------------------------


def join(client: TestClient, aid: str, uid: Any) -> httpx.Response:
    return client.post(f"/v1/activities/{aid}/locks", json={"user_id": uid}, headers=SERVICE)


def teams_page(client: TestClient, aid: str, query: str = "") -> Any:
    page = assert_ok(client.get(f"/v1/activities/{aid}/teams?{query}", headers=SERVICE), 200)
    assert set(page) == {"teams", "next_cursor"}, page
    for team in page["teams"]:
        check_team_shape(team)
        assert team["status"] == "open" and team["free_seats"] > 0, team
    return page


def test_join_201_existing_200_no_team_409_then_a_freed_seat(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("j", "t1", "L1", team_size=3, lock_ttl_s=60)
    clock(client).advance(0.01)
    open_team(client, "j", "t2", "L2")
    first = assert_ok(lock(client, "j", "t2", "u1"), 201)
    joined = assert_ok(join(client, "j", "x"), 201)  # t2 has the most seats taken
    assert set(joined) == NEW_LOCK_KEYS and joined["team_id"] == "t2", joined
    assert joined["status"] == "locked" and joined["user_id"] == "x"
    assert joined["released_team_id"] is None
    assert ms(joined["expires_at"]) - ms(joined["locked_at"]) == 60_000
    assert assert_ok(join(client, "j", "x"), 200) == {**joined, "existing": True}
    t2 = get_team(client, "j", "t2")
    assert [lk["user_id"] for lk in t2["locks"]] == ["u1", "x"]
    assert joined["version"] == t2["version"] == 3  # opened, u1's lock, x's: as a lock counts
    assert assert_ok(user_lock(client, "j", "x"), 200)["team_id"] == "t2"
    assert [assert_ok(join(client, "j", u), 201)["team_id"] for u in ("y", "z")] == ["t1"] * 2
    refused = assert_problem(join(client, "j", "w"), 409, "no_team_available")
    assert refused["next_unlock_at"] == first["expires_at"]  # the activity's earliest lock
    clock(client).advance(60)  # every lock expired, none swept: the seats are free
    assert assert_ok(join(client, "j", "w"), 201)["team_id"] == "t1"  # as empty: the older
    assert_problem(join(client, "nope", "w"), 404, "activity_not_found")


def test_join_never_picks_a_team_the_user_is_a_member_of(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("j", "t1", "L1", team_size=3)
    assert_ok(lock(client, "j", "t1", "m"), 201)
    assert_ok(confirm(client, "j", "t1", "m", "o-m"), 201)
    assert_problem(join(client, "j", "m"), 409, "no_team_available")  # t1 has a seat: not for m
    assert_problem(join(client, "j", "L1"), 409, "no_team_available")
    open_team(client, "j", "t2", "L2")
    assert assert_ok(join(client, "j", "m"), 201)["team_id"] == "t2"
    assert assert_ok(join(client, "j", "L2"), 201)["team_id"] == "t1"


def test_join_422_on_bad_input(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("j", "t1", "L1")
    for uid in ("", "a b", "x" * 65, 7, None, "é"):
        assert_problem(join(client, "j", uid), 422, "invalid_request")
    url = "/v1/activities/j/locks"
    bodies: list[Any] = [{}, {"user_id": "u", "team_id": "t1"}, []]
    for body in bodies:
        assert_problem(client.post(url, json=body, headers=SERVICE), 422, "invalid_request")
    assert_problem(client.post(url, content=b"", headers=SERVICE), 422, "invalid_request")
    assert_problem(join(client, "bad%20id", "u"), 422, "invalid_request")
    assert get_team(client, "j", "t1")["locks"] == []


def test_join_puts_back_the_activity_redis_forgot(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("j", "t1", "L1")
    services = app_services(client)
    portal(client).call(services.redis.delete, services.keys.activity("j"))
    assert assert_ok(join(client, "j", "u"), 201)["team_id"] == "t1"
    assert portal(client).call(services.redis.exists, services.keys.activity("j")) == 1


def test_list_open_teams_pages_closest_to_forming_first(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("l", "t0", "L0", team_size=4)
    for index in range(1, 5):
        clock(client).advance(0.01)
        open_team(client, "l", f"t{index}", f"L{index}")
    assert_ok(lock(client, "l", "t3", "a"), 201)
    assert_ok(lock(client, "l", "t3", "b"), 201)
    assert_ok(lock(client, "l", "t1", "c"), 201)
    for user in ("d", "e", "f"):
        assert_ok(lock(client, "l", "t4", user), 201)  # full: not listed
    first = teams_page(client, "l", "limit=2")
    assert [t["team_id"] for t in first["teams"]] == ["t3", "t1"]
    assert first["teams"][0] == get_team(client, "l", "t3")
    second = teams_page(client, "l", f"limit=2&cursor={first['next_cursor']}")
    assert [t["team_id"] for t in second["teams"]] == ["t0", "t2"]
    assert second["next_cursor"] is None  # nothing after t2
    whole = teams_page(client, "l", "status=open&has_free_seats=true&limit=100")
    assert [t["team_id"] for t in whole["teams"]] == ["t3", "t1", "t0", "t2"]
    assert whole["next_cursor"] is None
    assert teams_page(client, "l")["teams"] == whole["teams"]  # the defaults
    # The list and a join agree: the first listed is where the next join goes.
    assert assert_ok(join(client, "l", "g"), 201)["team_id"] == "t3"
    assert [t["team_id"] for t in teams_page(client, "l")["teams"]] == ["t1", "t0", "t2"]
    clock(client).advance(301)  # every lock expired unswept: the full team is listed again
    listed = teams_page(client, "l")["teams"]
    assert [t["team_id"] for t in listed] == ["t0", "t1", "t2", "t3", "t4"]
    assert all(t["locks"] == [] and t["free_seats"] == 3 for t in listed)


def test_list_open_teams_422_and_404(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("l", "t0", "L0")
    open_team(client, "l", "t1", "L1")
    cursor = teams_page(client, "l", "limit=1")["next_cursor"]
    assert isinstance(cursor, str)
    make_activity(client, "empty")
    assert teams_page(client, "empty") == {"teams": [], "next_cursor": None}
    assert_problem(
        client.get("/v1/activities/nope/teams", headers=SERVICE), 404, "activity_not_found"
    )
    for query in (
        "limit=0",
        "limit=101",
        "limit=ten",
        "limit=",
        "status=closed",
        "status=formed&has_free_seats=true",
        "status=failed&has_free_seats=false",
        f"status=formed&cursor={cursor}",
        "status=",
        "has_free_seats=maybe",
        "cursor=",
        "cursor=nonsense",
        "cursor=" + "A" * 201,
        f"cursor={cursor}A",
        f"cursor={cursor}&limit=0",
        "foo=1",
        "limit=1&limit=2",
    ):
        r = client.get(f"/v1/activities/l/teams?{query}", headers=SERVICE)
        assert_problem(r, 422, "invalid_request")
    assert len(teams_page(client, "l", f"cursor={cursor}")["teams"]) == 1


# -- events feed --------------------------------------------------------------------


def test_events_feed_lists_what_happened_in_id_order(
    client: TestClient, opened_team: OpenTeam
) -> None:
    opened_team("ev", "t1", "L", order_id="oL", team_size=2, lock_ttl_s=60, team_deadline_s=600)
    assert_ok(lock(client, "ev", "t1", "u1"), 201)
    formed = assert_ok(confirm(client, "ev", "t1", "u1", "o1"), 201)["team"]
    open_team(client, "ev", "t2", "M", order="oM")
    expired = assert_ok(lock(client, "ev", "t2", "u2"), 201)
    clock(client).advance(61)
    assert get_team(client, "ev", "t2")["locks"] == []
    clock(client).advance(600)
    failed = get_team(client, "ev", "t2")
    assert failed["status"] == "failed"
    # Looking again and trying to lock do not fail the team a second time.
    get_team(client, "ev", "t2")
    assert_problem(lock(client, "ev", "t2", "u3"), 409, "team_failed")

    # Opening a team flushes the activity's outbox before answering: a barrier after which
    # everything above is in the feed (and a second team.failed would be too).
    open_team(client, "ev", "t3", "N")
    events = wait_events(client, 7)
    assert [(e["type"], e["data"]["team_id"]) for e in events] == [
        ("team.opened", "t1"),
        ("team.member_joined", "t1"),
        ("team.formed", "t1"),
        ("team.opened", "t2"),
        ("lock.expired", "t2"),
        ("team.failed", "t2"),
        ("team.opened", "t3"),
    ]
    ids = [e["id"] for e in events]
    assert all(isinstance(i, int) and i > 0 for i in ids) and ids == sorted(set(ids))
    for event in events:
        assert set(event) == {"id", "type", "at", "data"}
        assert event["data"]["activity_id"] == "ev"
        ms(event["at"])

    opened, joined, formed_ev, _opened2, lock_expired, failed_ev, _opened3 = events
    assert opened["data"]["leader_id"] == "L" and opened["data"]["order_id"] == "oL"
    assert joined["data"]["user_id"] == "u1" and joined["data"]["order_id"] == "o1"
    assert formed_ev["data"]["members"] == [
        {"user_id": "L", "order_id": "oL"},
        {"user_id": "u1", "order_id": "o1"},
    ]
    assert formed_ev["at"] == formed["formed_at"]
    assert lock_expired["data"]["user_id"] == "u2"
    assert lock_expired["at"] == expired["expires_at"]
    assert failed_ev["data"]["members"] == [{"user_id": "M", "order_id": "oM"}]
    assert failed_ev["at"] == failed["failed_at"]

    # Paging: limit/after/next_after walk the same list.
    walked: list[dict[str, Any]] = []
    after = 0
    for _ in range(10):
        page = assert_ok(client.get(f"/v1/events?after={after}&limit=4", headers=SERVICE), 200)
        assert set(page) == {"events", "next_after"}
        assert len(page["events"]) <= 4
        if not page["events"]:
            assert page["next_after"] == after
            break
        assert page["next_after"] == page["events"][-1]["id"]
        walked.extend(page["events"])
        after = page["next_after"]
    assert walked == events
    one = assert_ok(client.get(f"/v1/events?after={ids[1]}&limit=1", headers=SERVICE), 200)
    assert one == {"events": [events[2]], "next_after": ids[2]}
    default = assert_ok(client.get("/v1/events", headers=SERVICE), 200)
    assert default["events"] == events and default["next_after"] == ids[-1]
    beyond = assert_ok(client.get(f"/v1/events?after={ids[-1] + 100}", headers=SERVICE), 200)
    assert beyond == {"events": [], "next_after": ids[-1] + 100}


def test_events_from_lazy_checks_reach_the_feed_without_another_write(
    client: TestClient, opened_team: OpenTeam
) -> None:
    """A GET that expires a lock or fails a team writes no SQL: the background writer does."""
    opened = opened_team(
        "lazy", "t1", "L", order_id="oL", team_size=3, lock_ttl_s=10, team_deadline_s=100
    )
    held = assert_ok(lock(client, "lazy", "t1", "u1"), 201)
    clock(client).advance(11)
    get_team(client, "lazy", "t1")
    clock(client).advance(100)
    assert get_team(client, "lazy", "t1")["status"] == "failed"
    events = wait_events(client, 3)
    assert [e["type"] for e in events] == ["team.opened", "lock.expired", "team.failed"]
    assert events[1]["data"] == {
        "activity_id": "lazy",
        "team_id": "t1",
        "user_id": "u1",
        "locked_at": held["locked_at"],
        "expired_at": held["expires_at"],
        "version": 3,  # opened 1, locked 2, its expiry 3
    }
    assert events[2]["data"] == {
        "activity_id": "lazy",
        "team_id": "t1",
        "members": [{"user_id": "L", "order_id": "oL"}],
        "reason": "deadline",  # or dissolved, abandoned
        "version": 4,
    }
    assert events[0]["data"]["version"] == 1
    assert events[2]["at"] == opened["deadline_at"]


def test_events_feed_422_on_bad_query(client: TestClient, opened_team: OpenTeam) -> None:
    opened_team("a", "t1", "L")
    events = wait_events(client, 1)
    for query in (
        "after=-1",
        "limit=0",
        "limit=-5",
        "limit=1001",
        "after=abc",
        "limit=ten",
        "after=1.5",
        "after=",
        "limit=",
        "foo=1",
        "after=0&foo=1",
        "after=1&after=2",
        "after=99999999999999999999",
    ):
        r = client.get(f"/v1/events?{query}", headers=SERVICE)
        assert_problem(r, 422, "invalid_request")
    assert assert_ok(client.get("/v1/events?limit=1000", headers=SERVICE), 200)["events"] == events
    assert assert_ok(client.get("/v1/events?limit=1", headers=SERVICE), 200)["events"] == events[:1]
