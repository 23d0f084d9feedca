"""HTTP tests of an activity's sale (SPEC §3 Activities): its schedule, its stock, the
longest hold and late confirm as a create sets them and a read shows them, on fakeredis and
a real redis-server, SQLite and PostgreSQL (the `client` fixture)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

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


def at(seconds: float) -> str:
    """The time `seconds` from now (the machine's clock, Redis's too), as a client sends it."""
    moment = datetime.now(UTC) + timedelta(seconds=seconds)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read(client: TestClient, aid: str) -> Any:
    return assert_ok(client.get(f"/v1/activities/{aid}", headers=SERVICE), 200)


def listed(client: TestClient, status: str) -> list[str]:
    page = assert_ok(client.get(f"/v1/activities?status={status}", headers=SERVICE), 200)
    return [a["activity_id"] for a in page["activities"]]


def test_create_shows_the_sale_and_the_status_follows_redis_clock(client: TestClient) -> None:
    starts, ends = at(60), at(120)
    made = make_activity(
        client, "s", starts_at=starts, ends_at=ends, stock=10, max_hold_s=600, late_confirm=True
    )
    assert made["starts_at"] == starts and made["ends_at"] == ends
    assert (made["stock"], made["stock_left"], made["stock_held_by_locks"]) == (10, 10, 0)
    assert (made["max_hold_s"], made["late_confirm"], made["status"]) == (600, True, "scheduled")
    plain = make_activity(client, "plain", lock_ttl_s=30)
    assert (plain["max_hold_s"], plain["late_confirm"], plain["status"]) == (30, False, "open")
    assert not {"starts_at", "ends_at", "stock", "stock_left", "stock_held_by_locks"} & set(plain)
    assert listed(client, "scheduled") == ["s"] and listed(client, "open") == ["plain"]

    app_services(client).clock.advance(60)
    assert read(client, "s")["status"] == "open"
    assert listed(client, "open") == ["plain", "s"] and listed(client, "scheduled") == []
    app_services(client).clock.advance(60)
    assert read(client, "s")["status"] == "ended"
    assert listed(client, "ended") == ["s"]
    assert_ok(client.patch("/v1/activities/s", json={"status": "closed"}, headers=ADMIN), 200)
    assert read(client, "s")["status"] == "closed"  # closed wins
    assert listed(client, "closed") == ["s"] and listed(client, "ended") == []


def test_the_redis_copy_carries_the_sale_also_after_a_loss(client: TestClient) -> None:
    starts, ends = at(60), at(120)
    make_activity(client, "c", starts_at=starts, ends_at=ends, stock=7, late_confirm=True)
    make_activity(client, "d", lock_ttl_s=20)
    services = app_services(client)

    def copy(aid: str) -> dict[str, str]:
        async def get() -> dict[str, str]:
            fields: dict[str, str] = await services.redis.hgetall(services.keys.activity(aid))
            return fields

        return portal(client).call(get)

    def ms_of(stamp: str) -> str:
        return str(round(datetime.fromisoformat(stamp).timestamp() * 1000))

    sale = {"starts_ms", "ends_ms", "stock", "max_hold_ms", "late_confirm"}
    wanted = {
        "starts_ms": ms_of(starts),
        "ends_ms": ms_of(ends),
        "stock": "7",
        "max_hold_ms": "300000",
        "late_confirm": "1",
    }
    assert {k: v for k, v in copy("c").items() if k in sale} == wanted
    assert {k: v for k, v in copy("d").items() if k in sale} == {"max_hold_ms": "20000"}
    portal(client).call(services.redis.flushall)
    assert read(client, "c")["stock_left"] == 7
    open_reply = client.post("/v1/activities/c/teams", json={"leader_id": "L"}, headers=SERVICE)
    assert open_reply.status_code in (201, 409)  # the copy is put back from SQL first
    assert {k: v for k, v in copy("c").items() if k in sale} == wanted


def test_create_refuses_a_bad_sale_and_changes_nothing(client: TestClient) -> None:
    starts = at(60)
    for bad in (
        {"starts_at": starts, "ends_at": starts},
        {"starts_at": starts, "ends_at": at(30)},
        {"starts_at": "2030-01-01T00:00:00"},  # no offset: not UTC
        {"starts_at": "tomorrow"},
        {"starts_at": 1893456000},
        {"ends_at": "1969-12-31T23:59:59Z"},
        {"stock": 0},
        {"stock": 10_000_001},
        {"stock": "5"},
        {"stock": 5.0},
        {"max_hold_s": 86_401},
        {"max_hold_s": 299},  # below the default lock_ttl_s
        {"lock_ttl_s": 60, "max_hold_s": 59},
        {"late_confirm": "yes"},
        {"late_confirm": 1},
        {"sale": True},
    ):
        response = client.post("/v1/activities", json={"activity_id": "x", **bad}, headers=ADMIN)
        assert_problem(response, 422, "invalid_request")
    assert_problem(client.get("/v1/activities/x", headers=SERVICE), 404, "activity_not_found")
    assert_problem(client.get("/v1/activities?status=started", headers=SERVICE), 422)
    made = make_activity(client, "y", lock_ttl_s=60, max_hold_s=60, stock=1)
    assert made["max_hold_s"] == 60


def test_create_again_compares_the_sale(client: TestClient) -> None:
    sale = {"starts_at": at(60), "ends_at": at(120), "stock": 5, "max_hold_s": 900}
    made = make_activity(client, "i", **sale, late_confirm=True)
    again = client.post(
        "/v1/activities",
        json={"activity_id": "i", **sale, "late_confirm": True},
        headers=ADMIN,
    )
    assert assert_ok(again, 200) == made
    for other in (
        {**sale, "late_confirm": False},
        {**sale, "stock": 6},
        {**sale, "max_hold_s": 901},
        {**sale, "ends_at": at(121)},
        {k: v for k, v in sale.items() if k != "starts_at"},
    ):
        response = client.post("/v1/activities", json={"activity_id": "i", **other}, headers=ADMIN)
        assert assert_problem(response, 409, "conflict")["activity"] == made
    # Without a sale, the defaults: max_hold_s = lock_ttl_s, late_confirm false.
    plain = make_activity(client, "p")
    again = client.post(
        "/v1/activities",
        json={"activity_id": "p", "max_hold_s": 300, "late_confirm": False},
        headers=ADMIN,
    )
    assert assert_ok(again, 200) == plain


# -- the refusals: schedule and stock --------------------------------------------------


def join(client: TestClient, aid: str, uid: str) -> Any:
    return client.post(f"/v1/activities/{aid}/locks", json={"user_id": uid}, headers=SERVICE)


def test_outside_the_schedule_opening_locking_and_joining_are_refused(client: TestClient) -> None:
    starts = at(60)
    make_activity(client, "early", starts_at=starts, ends_at=at(120))
    opened = client.post("/v1/activities/early/teams", json={"leader_id": "L"}, headers=SERVICE)
    assert assert_problem(opened, 409, "activity_not_started")["starts_at"] == starts
    problem = assert_problem(join(client, "early", "u1"), 409, "activity_not_started")
    assert problem["starts_at"] == starts
    locked = lock(client, "early", "t1", "u1")
    assert assert_problem(locked, 409, "activity_not_started")["starts_at"] == starts
    assert read(client, "early")["teams_open"] == 0

    app_services(client).clock.advance(60)
    open_team(client, "early", "t1", "L")
    assert_ok(lock(client, "early", "t1", "u1"), 201)
    app_services(client).clock.advance(60)
    for refused in (
        client.post("/v1/activities/early/teams", json={"leader_id": "M"}, headers=SERVICE),
        lock(client, "early", "t1", "u2"),
        join(client, "early", "u2"),
    ):
        assert_problem(refused, 409, "activity_ended")
    # The live lock is still paid for: the team runs to its deadline.
    confirmed = client.post(
        "/v1/activities/early/teams/t1/members",
        json={"user_id": "u1", "order_id": "o1"},
        headers=SERVICE,
    )
    assert assert_ok(confirmed, 201)["team"]["members"][1]["user_id"] == "u1"


def test_no_unit_left_is_sold_out_with_the_next_unlock(client: TestClient) -> None:
    make_activity(client, "few", stock=2, team_size=3)
    open_team(client, "few", "t1", "L")
    held = assert_ok(lock(client, "few", "t1", "u1"), 201)
    body = read(client, "few")
    assert (body["stock_left"], body["stock_held_by_locks"]) == (0, 1)
    for refused in (
        lock(client, "few", "t1", "u2"),
        join(client, "few", "u2"),
        client.post("/v1/activities/few/teams", json={"leader_id": "M"}, headers=SERVICE),
    ):
        problem = assert_problem(refused, 409, "activity_sold_out")
        assert problem["next_unlock_at"] == held["expires_at"]
    assert read(client, "few") == body  # nothing changed
    # The lock's own unit: a repeat answers it unchanged.
    assert assert_ok(lock(client, "few", "t1", "u1"), 200)["existing"] is True
    assert_ok(client.delete("/v1/activities/few/teams/t1/locks/u1", headers=SERVICE), 200)
    assert read(client, "few")["stock_left"] == 1
    assert_ok(join(client, "few", "u2"), 201)


# -- PATCH: ends_at and stock ----------------------------------------------------------


def patch(client: TestClient, aid: str, body: Any) -> Any:
    return client.patch(f"/v1/activities/{aid}", json=body, headers=ADMIN)


def copy_of(client: TestClient, aid: str, *fields: str) -> list[str | None]:
    services = app_services(client)

    async def get() -> list[str | None]:
        values: list[str | None] = await services.redis.hmget(services.keys.activity(aid), fields)
        return values

    return portal(client).call(get)


def test_patch_raises_and_lowers_the_stock_down_to_what_is_held(client: TestClient) -> None:
    make_activity(client, "k", stock=5, team_size=3)
    open_team(client, "k", "t1", "L")
    assert_ok(lock(client, "k", "t1", "u1"), 201)  # 2 units held
    raised = assert_ok(patch(client, "k", {"stock": 8}), 200)
    assert (raised["stock"], raised["stock_left"]) == (8, 6)
    lowered = assert_ok(patch(client, "k", {"stock": 2}), 200)
    assert (lowered["stock"], lowered["stock_left"]) == (2, 0)
    assert copy_of(client, "k", "stock") == ["2"]
    assert_problem(lock(client, "k", "t1", "u2"), 409, "activity_sold_out")

    refused = assert_problem(patch(client, "k", {"stock": 1, "name": "x"}), 409, "conflict")
    assert refused["stock_held"] == 2
    assert read(client, "k") == lowered and copy_of(client, "k", "stock") == ["2"]
    # An activity without a stock gains one the same way.
    make_activity(client, "free")
    open_team(client, "free", "t1", "L")
    for bad in ({"stock": 0}, {"stock": 10_000_001}, {"stock": "1"}, {"stock": None, "x": 1}):
        assert_problem(patch(client, "free", bad), 422, "invalid_request")
    capped = assert_ok(patch(client, "free", {"stock": 1}), 200)
    assert (capped["stock"], capped["stock_left"], capped["stock_held_by_locks"]) == (1, 0, 0)
    assert_problem(lock(client, "free", "t1", "u1"), 409, "activity_sold_out")

    entries = portal(client).call(app_services(client).audit.page, 10)["entries"]
    updates = [e["target"] for e in entries if e["action"] == "activity.update"]
    assert updates == ["free", "k", "k"]  # newest first; the refused PATCH wrote none


def test_patch_moves_the_end_and_the_copy_follows(client: TestClient) -> None:
    starts = at(30)
    make_activity(client, "e", starts_at=starts, ends_at=at(3600))
    for bad in ({"ends_at": starts}, {"ends_at": at(10)}, {"ends_at": "soon"}, {"ends_at": 5}):
        assert_problem(patch(client, "e", bad), 422, "invalid_request")
    ends = at(60)
    moved = assert_ok(patch(client, "e", {"ends_at": ends}), 200)
    assert moved["ends_at"] == ends
    ms = round(datetime.fromisoformat(ends).timestamp() * 1000)
    assert copy_of(client, "e", "ends_ms") == [str(ms)]
    app_services(client).clock.advance(60)
    assert read(client, "e")["status"] == "ended"
    assert_problem(join(client, "e", "u1"), 409, "activity_ended")
    # Moved later again, the sale reopens.
    assert assert_ok(patch(client, "e", {"ends_at": at(3600)}), 200)["status"] == "open"
    assert_problem(patch(client, "nope", {"ends_at": ends}), 404, "activity_not_found")


def test_patch_after_redis_lost_the_copy_checks_what_sql_holds(client: TestClient) -> None:
    make_activity(client, "lost", stock=3, team_size=3)
    open_team(client, "lost", "t1", "L")
    assert_ok(lock(client, "lost", "t1", "u1"), 201)
    confirmed = client.post(
        "/v1/activities/lost/teams/t1/members",
        json={"user_id": "u1", "order_id": "o1"},
        headers=SERVICE,
    )
    assert_ok(confirmed, 201)
    portal(client).call(app_services(client).redis.flushall)
    # The copy and the counts come back from SQL first: 2 members hold 2 units.
    refused = assert_problem(patch(client, "lost", {"stock": 1}), 409, "conflict")
    assert refused["stock_held"] == 2
    assert copy_of(client, "lost", "stock") == ["3"]
    assert assert_ok(patch(client, "lost", {"stock": 2}), 200)["stock_left"] == 0
