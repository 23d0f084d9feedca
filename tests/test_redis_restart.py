"""The service keeps working across a real Redis restart (its scripts are loaded again)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from groupbuy.app import build_services
from groupbuy.db import Database
from groupbuy.redis_client import connect_redis
from groupbuy.settings import load_settings
from tests.redis_server import free_port, start_redis

pytestmark = pytest.mark.real


@pytest.mark.skipif(
    not shutil.which("redis-server") and not os.environ.get("CI"), reason="needs redis-server"
)
async def test_locks_work_after_a_redis_restart(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "redis-data"
    data.mkdir()
    persist = ("--appendonly", "yes", "--appendfsync", "always")
    server = start_redis(*persist, port=port, directory=data)
    settings = load_settings(
        None,
        {
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/db",
            "GROUPBUY_REDIS_URL": server.url,
        },
    )
    client = connect_redis(settings.redis)  # the service's own client and retry policy
    database = Database(settings.database.effective_url)
    await database.create_all()
    services = build_services(settings, redis=client, database=database)
    try:
        await services.scripts.load()
        await services.teams.create_activity("a1")
        await services.teams.open_team("a1", "L", team_id="t1")
        assert (await services.teams.lock("a1", "t1", "u1")).created
        server.stop()  # the scripts cache is gone with the process; the AOF keeps the data
        server = start_redis(*persist, port=port, directory=data)
        assert not await services.scripts.loaded()
        assert (await services.teams.lock("a1", "t1", "u2")).created
        team = await services.teams.get_team("a1", "t1")
        assert [lock["user_id"] for lock in team["locks"]] == ["u1", "u2"]
    finally:
        await client.aclose()
        await database.dispose()
        server.stop()


@pytest.mark.skipif(
    not shutil.which("redis-server") and not os.environ.get("CI"), reason="needs redis-server"
)
async def test_grabs_survive_a_redis_restart_before_they_are_recorded(tmp_path: Path) -> None:
    """SPEC §4.5: with appendfsync always, every answered grab ends up in SQL after a restart."""
    port = free_port()
    data = tmp_path / "redis-data"
    data.mkdir()
    persist = ("--appendonly", "yes", "--appendfsync", "always")
    server = start_redis(*persist, port=port, directory=data)
    settings = load_settings(
        None,
        {
            "GROUPBUY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/db",
            "GROUPBUY_REDIS_URL": server.url,
        },
    )
    client = connect_redis(settings.redis)
    database = Database(settings.database.effective_url)
    await database.create_all()
    services = build_services(settings, redis=client, database=database)
    try:
        packets = services.packets
        await packets.deposit("sender", 100, "funds")
        await packets.send("sender", 100, 10, packet_id="pk")
        won = {f"u{i}": (await packets.grab("pk", f"u{i}"))["amount_cents"] for i in range(6)}
        server.process.kill()  # a crash, not a shutdown: nothing gets flushed on the way out
        server.process.wait()
        server = start_redis(*persist, port=port, directory=data)
        assert await packets.writer.drain_all() == 6
        for user, amount in won.items():
            assert (await packets.account(user))["balance_cents"] == amount
            assert await packets.grab("pk", user) == {
                "status": "already_grabbed",
                "amount_cents": amount,
            }
        assert (await packets.grab("pk", "u9"))["remaining_count"] == 3
    finally:
        await client.aclose()
        await database.dispose()
        server.stop()
