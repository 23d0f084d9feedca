"""/readyz means "can serve now": scripts Redis forgot are loaded again by the check itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from tests.support.http import assert_ok
from tests.support.servers import free_port, server_binary, start_redis
from tests.support.settings import settings_for


def test_readyz_loads_the_scripts_redis_forgot(client: TestClient) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    assert client.portal is not None
    assert_ok(client.get("/readyz"), 200)
    client.portal.call(services.redis.script_flush)
    assert not client.portal.call(services.scripts.loaded)
    ready = assert_ok(client.get("/readyz"), 200)
    assert ready["checks"] == {"redis": "ok", "scripts": "ok", "database": "ok"}
    assert client.portal.call(services.scripts.loaded)


@pytest.mark.real
@pytest.mark.skipif(
    server_binary() is None and not os.environ.get("CI"), reason="needs a server binary"
)
def test_readyz_is_ready_on_the_first_call_after_a_redis_restart(
    tmp_path: Path, database_url: str
) -> None:
    port, data = free_port(), tmp_path / "redis"
    data.mkdir()
    server = start_redis(port=port, directory=data)
    try:
        settings = settings_for(server.url, database_url).replace("scheduler", enabled=False)
        with TestClient(create_app(settings)) as client:
            assert_ok(client.get("/readyz"), 200)
            server.stop()
            server = start_redis(port=port, directory=data)
            ready = assert_ok(client.get("/readyz"), 200)
            assert ready["checks"] == {"redis": "ok", "scripts": "ok", "database": "ok"}
    finally:
        server.stop()
