"""A backing service that is down gives 503 problems and a failing /readyz, never a 500."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.settings import load_settings
from tests.support.http import ADMIN, SERVICE, app_services, assert_problem
from tests.support.schema import database_with_schema
from tests.support.settings import API_KEYS, settings_without_redis
from tests.support.sql_outage import exclusive_lock


def test_redis_down_is_a_503(tmp_path: Path) -> None:
    settings = settings_without_redis(tmp_path)
    with TestClient(create_app(settings)) as client:
        created = client.post("/v1/activities", json={"activity_id": "a1"}, headers=ADMIN)
        assert created.status_code == 503
        assert created.headers["content-type"] == "application/problem+json"
        assert created.json()["code"] == "redis_unavailable"
        locked = client.post(
            "/v1/activities/a1/teams/t1/locks", json={"user_id": "u"}, headers=ADMIN
        )
        assert locked.status_code == 503 and locked.json()["code"] == "redis_unavailable"
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["redis"].startswith(
            "unreachable"
        )
        assert ready.json()["checks"]["database"] == "ok"
        assert client.get("/healthz").status_code == 200


def test_sql_locked_writes_are_503_and_a_confirm_waits_for_its_member_in_sql(
    tmp_path: Path,
) -> None:
    """A confirm answers only once the member is in SQL: while SQL takes no writes it
    answers 503 database_unavailable (so do its repeats), with the user a member in Redis
    already, so that the seat cannot be lost when the lock's time runs out; once SQL is
    back the repeat answers 200 with the first confirm's `formed`. Deposits answer 503 too;
    reads go on (SQLite's readers are not blocked by a writer)."""
    url = database_with_schema(tmp_path, name="db")
    settings = load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": url,
            "GROUPBUY_DATABASE_TIMEOUT_S": "0.2",
            "GROUPBUY_SCHEDULER_ENABLED": "false",  # only the calls write to SQL
        },
    )
    team = "/v1/activities/a/teams/t1"
    with TestClient(create_app(settings)) as client:
        body = {"activity_id": "a", "team_size": 2, "lock_ttl_s": 5}
        assert client.post("/v1/activities", json=body, headers=ADMIN).status_code == 201
        body = {"leader_id": "L", "team_id": "t1"}
        assert client.post("/v1/activities/a/teams", json=body, headers=SERVICE).status_code == 201
        lock = client.post(f"{team}/locks", json={"user_id": "u"}, headers=SERVICE)
        assert lock.status_code == 201, lock.text
        locker = asyncio.run(exclusive_lock(Path(url.removeprefix("sqlite+aiosqlite:///"))))
        try:
            paid = {"user_id": "u", "order_id": "o1"}
            for _attempt in range(2):
                confirm = client.post(f"{team}/members", json=paid, headers=SERVICE)
                assert_problem(confirm, 503, "database_unavailable")
            # The seat is the user's in Redis: a member now, no lock left to run out.
            app_services(client).clock.advance(10)
            read = client.get(team, headers=SERVICE).json()
            assert [m["user_id"] for m in read["members"]] == ["L", "u"] and not read["locks"]
            members = locker.execute("SELECT user_id FROM team_members").fetchall()
            assert members == [("L",)]  # not in SQL: the confirm said no
            body = {"amount_cents": 5, "reference": "r1"}
            deposit = client.post("/v1/accounts/x/deposits", json=body, headers=ADMIN)
            assert_problem(deposit, 503, "database_unavailable")
            assert client.get("/v1/accounts/x", headers=SERVICE).status_code == 200
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        confirm = client.post(f"{team}/members", json=paid, headers=SERVICE)
        assert confirm.status_code == 200, confirm.text
        assert confirm.json()["formed"] is True  # the first confirm completed the team
        with sqlite3.connect(Path(url.removeprefix("sqlite+aiosqlite:///"))) as reader:
            rows = reader.execute("SELECT user_id, order_id FROM team_members ORDER BY seq")
            assert rows.fetchall() == [("L", None), ("u", "o1")]
