"""A backing service that is down gives 503 problems and a failing /readyz, never a 500."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from groupbuy.app import create_app
from groupbuy.settings import load_settings
from tests.conftest import ADMIN, ADMIN_KEY, SERVICE_KEY
from tests.redis_server import free_port


def test_redis_down_is_a_503(tmp_path: Path) -> None:
    settings = load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": f"admin:{ADMIN_KEY},service:{SERVICE_KEY}",
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
            "GROUPBUY_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "GROUPBUY_REDIS_SOCKET_TIMEOUT_S": "0.2",
        },
    )
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
