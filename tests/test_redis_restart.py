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
from tests.support.fixtures import SendPacketViaServices
from tests.support.servers import server_binary
from tests.support.storm import RedisUnderTest

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        server_binary() is None and not os.environ.get("CI"), reason="needs a server binary"
    ),
]


@pytest.fixture
async def redis_server(tmp_path: Path) -> AsyncIterator[RedisUnderTest]:
    """A server with AOF `appendfsync always` that can crash and come back on its data
    (the fault matrix's, tests/faults/)."""
    server = RedisUnderTest(tmp_path / "redis-data")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def services(redis_server: RedisUnderTest, database_url: str) -> AsyncIterator[Services]:
    """The services with the production Redis client (its retry policy included)."""
    settings = load_settings(
        None,
        {
            "GROUPBUY_DATABASE_URL": database_url,
            "GROUPBUY_REDIS_URL": redis_server.url,
        },
    )
    database = Database(settings.database.effective_url)
    built = build_services(settings, redis=connect_redis(settings.redis), database=database)
    await built.scripts.load()
    try:
        yield built
    finally:
        await built.redis.aclose()
        await database.dispose()


async def test_locks_work_after_a_redis_restart(
    redis_server: RedisUnderTest, services: Services
) -> None:
    await services.teams.activities.create_activity("a1")
    await services.teams.activities.open_team("a1", "L", team_id="t1")
    assert (await services.teams.seats.lock("a1", "t1", "u1")).created
    redis_server.kill()
    redis_server.restart()  # the scripts cache is gone; the AOF keeps the data
    assert not await services.scripts.loaded()
    assert (await services.teams.seats.lock("a1", "t1", "u2")).created
    team = await services.teams.activities.get_team("a1", "t1")
    assert [lock["user_id"] for lock in team["locks"]] == ["u1", "u2"]


async def test_grabs_survive_a_redis_restart_before_they_are_recorded(
    redis_server: RedisUnderTest,
    services: Services,
    sent_packet_via_services: SendPacketViaServices,
) -> None:
    """SPEC §4.5: with appendfsync always, every answered grab ends up in SQL after a crash."""
    packets = services.packets
    await sent_packet_via_services(100, 10, funds=100)
    won = {f"u{i}": (await packets.grabs.grab("pk", f"u{i}"))["amount_cents"] for i in range(6)}
    redis_server.kill()
    redis_server.restart()
    assert await packets.writer.drain_all() == 6
    for user, amount in won.items():
        assert (await packets.accounts.account(user))["balance_cents"] == amount
        assert await packets.grabs.grab("pk", user) == {
            "status": "already_grabbed",
            "amount_cents": amount,
        }
    assert (await packets.grabs.grab("pk", "u9"))["remaining_count"] == 3
