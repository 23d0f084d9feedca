"""Fixtures: the same tests run on fakeredis (with Lua) and on a real redis-server."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio as aioredis
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.services import Services, build_services
from groupbuy.settings import Settings, load_settings
from groupbuy.storage.db import Database
from groupbuy.testing.servers import start_redis

ADMIN_KEY = "admin-secret-for-tests"
SERVICE_KEY = "service-secret-for-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SERVICE = {"Authorization": f"Bearer {SERVICE_KEY}"}


@pytest.fixture(scope="session")
def real_redis_url() -> Iterator[str]:
    """A real redis-server: GROUPBUY_TEST_REDIS_URL, or one started here on a free port."""
    given = os.environ.get("GROUPBUY_TEST_REDIS_URL")
    if given:
        yield given
        return
    try:
        server = start_redis()
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise
        pytest.skip("redis-server is not installed; the test command installs it")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.real)])
def backend(request: pytest.FixtureRequest) -> str:
    """Which Redis the test runs on: 'fake' (fakeredis + lupa) or 'real' (redis-server)."""
    return str(request.param)


@pytest.fixture
def redis_url(backend: str, request: pytest.FixtureRequest) -> str:
    """'' for a fresh embedded fakeredis, or the real server's URL, emptied for this test."""
    if backend == "fake":
        return ""
    url = str(request.getfixturevalue("real_redis_url"))
    with redis.Redis.from_url(url) as sync_client:
        sync_client.flushall()
        sync_client.script_flush()
    return url


def make_async_redis(url: str) -> Any:
    """A fresh asyncio client: fakeredis on its own server when `url` is empty."""
    if not url:
        return fakeredis.FakeAsyncRedis(
            server=fakeredis.FakeServer(version=(7, 0)), decode_responses=True
        )
    return aioredis.Redis.from_url(url, decode_responses=True, max_connections=512)


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Any]:
    client = make_async_redis(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    """Settings for one test: its own SQLite file, the backend's Redis, known keys."""
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": f"admin:{ADMIN_KEY},service:{SERVICE_KEY}",
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'groupbuy.db'}",
            "GROUPBUY_REDIS_URL": redis_url,
            "GROUPBUY_OUTBOX_FLUSH_INTERVAL_S": "0.05",
        },
    )


@pytest.fixture
async def services(settings: Settings, redis_client: Any) -> AsyncIterator[Services]:
    """The wired services on this test's loop (no HTTP), tables created and scripts loaded."""
    database = Database(settings.database.effective_url)
    built = build_services(settings, redis=redis_client, database=database)
    await database.create_all()
    await built.scripts.load()
    try:
        yield built
    finally:
        await database.dispose()


def settings_without_redis(tmp_path: Path) -> Settings:
    """Settings whose Redis URL points at a closed loopback port (Redis is down)."""
    from groupbuy.testing.servers import free_port

    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": f"admin:{ADMIN_KEY},service:{SERVICE_KEY}",
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
            "GROUPBUY_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "GROUPBUY_REDIS_SOCKET_TIMEOUT_S": "0.2",
        },
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The HTTP API through Starlette's TestClient, lifespan included."""
    with TestClient(create_app(settings)) as test_client:
        yield test_client
