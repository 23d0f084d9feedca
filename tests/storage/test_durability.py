"""The start-up check of Redis persistence and eviction (SPEC §5): warn, or refuse when strict.

The database is a SQLite file: what is checked is Redis's configuration, which no SQL
database changes."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from groupbuy.cli import main
from groupbuy.services import build_services, running
from groupbuy.storage.durability import RedisNotDurable, check_durability, check_redis, risks
from groupbuy.storage.embedded import EmbeddedEngine
from tests.support.database import sqlite_url
from tests.support.redis import make_async_redis
from tests.support.servers import RedisProcess, server_binary, start_redis
from tests.support.settings import settings_for

needs_server = pytest.mark.skipif(
    server_binary() is None and not os.environ.get("CI"), reason="needs a server binary"
)
DURABLE = ("--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")
LOSSY = ("--appendonly", "no", "--maxmemory-policy", "allkeys-lru")


def test_each_risky_setting_is_named_with_its_value_and_what_it_risks() -> None:
    good = {"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"}
    assert risks(good) == []
    (no_aof,) = risks({**good, "appendonly": "no"})
    assert no_aof.startswith("appendonly is 'no': a crash loses every write since the last")
    (everysec,) = risks({**good, "appendfsync": "everysec"})
    assert everysec.startswith("appendfsync is 'everysec': a crash can lose up to ~1 s")
    (os_fsync,) = risks({**good, "appendfsync": "no"})
    assert os_fsync.startswith("appendfsync is 'no': the OS decides")
    for policy in ("allkeys-lru", "volatile-ttl", "allkeys-random"):
        (evicting,) = risks({**good, "maxmemory-policy": policy})
        assert evicting.startswith(f"maxmemory-policy is '{policy}': when full, Redis silently")
        assert "loses money" in evicting


@pytest.fixture
def lossy() -> Iterator[RedisProcess]:
    server = start_redis(*LOSSY)
    try:
        yield server
    finally:
        server.stop()


def durability_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "groupbuy.storage.durability"]


@pytest.mark.real
@needs_server
async def test_a_lossy_redis_is_warned_about_setting_by_setting(
    lossy: RedisProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(lossy.url, sqlite_url(tmp_path)).replace("scheduler", enabled=False)
    async with running(build_services(settings)) as services:
        assert await services.redis.ping()  # started: a warning does not refuse
    lines = durability_lines(caplog)
    assert [r.levelno for r in lines] == [logging.WARNING, logging.WARNING]
    where = f"redis at {lossy.url}: "
    assert lines[0].getMessage().startswith(f"{where}appendonly is 'no': a crash loses")
    assert lines[1].getMessage().startswith(f"{where}maxmemory-policy is 'allkeys-lru'")


@pytest.mark.real
@needs_server
async def test_strict_refuses_a_lossy_redis(lossy: RedisProcess, tmp_path: Path) -> None:
    settings = settings_for(lossy.url, sqlite_url(tmp_path)).replace("redis", strict=True)
    with pytest.raises(RedisNotDurable) as refused:
        async with running(build_services(settings)):
            pytest.fail("started on a Redis that can lose acknowledged writes")
    message = str(refused.value)
    assert message.startswith(f"redis at {lossy.url} could lose acknowledged writes, and ")
    assert "appendonly is 'no'" in message and "maxmemory-policy is 'allkeys-lru'" in message
    assert "\n" not in message


@pytest.mark.real
@needs_server
@pytest.mark.parametrize("command", ["worker", "serve"])
def test_the_commands_refuse_in_one_line_and_exit_2(
    command: str,
    lossy: RedisProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GROUPBUY_CONFIG", str(Path(__file__).parents[2] / "config.toml"))
    monkeypatch.setenv("GROUPBUY_REDIS_URL", lossy.url)
    monkeypatch.setenv("GROUPBUY_REDIS_STRICT", "true")
    monkeypatch.setenv("GROUPBUY_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path}/db")
    monkeypatch.setenv("GROUPBUY_SCHEDULER_ENABLED", "false")
    # Only warnings and errors on stderr: the INFO line of SQLite's schema upgrade at start
    # is not what this test is about.
    monkeypatch.setenv("GROUPBUY_LOG_LEVEL", "warning")
    # Bounded if the refusal ever goes: the command is stopped by the signal after 20 s.
    args = [command, "--port", "0"] if command == "serve" else [command]
    stop = threading.Timer(20, os.kill, (os.getpid(), signal.SIGTERM))
    stop.start()
    try:
        assert main(args) == 2
    finally:
        stop.cancel()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"groupbuy: redis at {lossy.url} could lose")


@pytest.mark.real
@needs_server
async def test_a_durable_redis_passes_even_when_strict(tmp_path: Path) -> None:
    server = start_redis(*DURABLE)
    client = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        assert await check_durability(client, "here", strict=True) == []
    finally:
        await client.aclose()
        server.stop()


@pytest.mark.real
@needs_server
async def test_the_embedded_engine_passes_when_strict(tmp_path: Path) -> None:
    binary = server_binary()
    assert binary is not None
    engine = EmbeddedEngine(binary, tmp_path / "data")
    engine.start()
    client = aioredis.Redis.from_url(engine.url, decode_responses=True)
    try:
        assert await check_durability(client, engine.url, strict=True) == []
    finally:
        await client.aclose()
        engine.stop()


@pytest.mark.real
@needs_server
async def test_a_redis_without_config_is_said_to_be_unchecked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = start_redis(*LOSSY, "--rename-command", "CONFIG", "")
    client = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        assert await check_durability(client, "managed", strict=True) == []
    finally:
        await client.aclose()
        server.stop()
    (line,) = durability_lines(caplog)
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith("redis at managed: cannot check persistence and eviction")


async def test_fakeredis_is_not_checked(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    client = make_async_redis("")
    settings = settings_for("", sqlite_url(tmp_path)).replace("redis", strict=True)
    assert settings.redis.embedded  # no URL: the in-process fakeredis
    await check_redis(client, settings.redis, "in-process")
    assert durability_lines(caplog) == []
    await client.aclose()
