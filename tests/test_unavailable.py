"""A backing service that is down gives 503 problems and a failing /readyz, never a 500."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from tests.support.http import ADMIN
from tests.support.settings import settings_without_redis


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
