"""The service across a real Redis restart: scripts load again, AOF-persisted grabs get recorded."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from groupbuy.services import Services, build_services
from groupbuy.settings import load_settings
from groupbuy.storage.db import Database
from groupbuy.storage.redis_client import connect_redis
from groupbuy.testing.servers import RedisProcess, free_port, server_binary, start_redis
from tests.support.fixtures import SendPacketViaServices

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        server_binary() is None and not os.environ.get("CI"), reason="needs a server binary"
    ),
]

PERSIST = ("--appendonly", "yes", "--appendfsync", "always")


class Restartable:
    """A server with AOF `appendfsync always` that can crash and come back on its data."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.data = tmp_path / "redis-data"
        self.data.mkdir()
        self.server: RedisProcess = start_redis(*PERSIST, port=self.port, directory=self.data)

    def crash_and_restart(self) -> None:
        """Kill -9 (nothing is flushed on the way out), then start again on the same data."""
        self.server.process.kill()
        self.server.process.wait()
        self.server = start_redis(*PERSIST, port=self.port, directory=self.data)


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[Restartable]:
    restartable = Restartable(tmp_path)
    try:
        yield restartable
    finally:
        restartable.server.stop()


@pytest.fixture
async def services(redis_server: Restartable, tmp_path: Path) -> AsyncIterator[Services]:
    """The services with the production Redis client (its retry policy included)."""
    settings = load_settings(
        None,
        {
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/db",
            "GROUPBUY_REDIS_URL": redis_server.server.url,
        },
    )
    database = Database(settings.database.effective_url)
    await database.create_all()
    built = build_services(settings, redis=connect_redis(settings.redis), database=database)
    await built.scripts.load()
    try:
        yield built
    finally:
        await built.redis.aclose()
        await database.dispose()


async def test_locks_work_after_a_redis_restart(
    redis_server: Restartable, services: Services
) -> None:
    await services.teams.create_activity("a1")
    await services.teams.open_team("a1", "L", team_id="t1")
    assert (await services.teams.lock("a1", "t1", "u1")).created
    redis_server.crash_and_restart()  # the scripts cache is gone; the AOF keeps the data
    assert not await services.scripts.loaded()
    assert (await services.teams.lock("a1", "t1", "u2")).created
    team = await services.teams.get_team("a1", "t1")
    assert [lock["user_id"] for lock in team["locks"]] == ["u1", "u2"]


async def test_grabs_survive_a_redis_restart_before_they_are_recorded(
    redis_server: Restartable, services: Services, sent_packet_via_services: SendPacketViaServices
) -> None:
    """SPEC §4.5: with appendfsync always, every answered grab ends up in SQL after a crash."""
    packets = services.packets
    await sent_packet_via_services(100, 10, funds=100)
    won = {f"u{i}": (await packets.grab("pk", f"u{i}"))["amount_cents"] for i in range(6)}
    redis_server.crash_and_restart()
    assert await packets.writer.drain_all() == 6
    for user, amount in won.items():
        assert (await packets.account(user))["balance_cents"] == amount
        assert await packets.grab("pk", user) == {
            "status": "already_grabbed",
            "amount_cents": amount,
        }
    assert (await packets.grab("pk", "u9"))["remaining_count"] == 3
