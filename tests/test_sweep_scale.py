"""Sweeping 10,000 expired locks on a real redis-server: bounded script calls, all evented once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from groupbuy.services import Services
from groupbuy.storage.events import EventRow
from tests.support.money import count

pytestmark = [pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])]

TEAMS = 1_000
LOCKS_PER_TEAM = 10


async def test_sweep_ten_thousand_expired_locks(
    services: Services, redis_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    teams = services.teams
    await teams.activities.create_activity("big", team_size=LOCKS_PER_TEAM + 1, lock_ttl_s=60)
    gate = asyncio.Semaphore(64)

    async def fill(t: int) -> None:
        async with gate:
            await teams.activities.open_team("big", f"L{t}", team_id=f"t{t}")
            for u in range(LOCKS_PER_TEAM):
                await teams.seats.lock("big", f"t{t}", f"u{t}-{u}")

    await asyncio.gather(*(fill(t) for t in range(TEAMS)))
    await redis_client.config_set("slowlog-log-slower-than", 0)
    await redis_client.config_set("slowlog-max-len", 100_000)
    await redis_client.slowlog_reset()
    services.clock.advance(60)

    began = time.perf_counter()
    report = await services.jobs.run("sweep_locks")
    seconds = time.perf_counter() - began
    slowest = max(await redis_client.slowlog_get(100_000), key=lambda entry: entry["duration"])
    await redis_client.config_set("slowlog-log-slower-than", 10_000)

    assert report["locks_expired"] == TEAMS * LOCKS_PER_TEAM and report["teams"] == TEAMS
    assert await count(services, EventRow, type="lock.expired") == TEAMS * LOCKS_PER_TEAM
    assert (await services.jobs.run("sweep_locks"))["locks_expired"] == 0
    command = slowest["command"]
    command = command.decode() if isinstance(command, bytes) else str(command)
    name = " ".join(command.split()[:3])[:60]
    with capsys.disabled():
        print(
            f"\n[figures] sweep_locks: {report['locks_expired']:,} expired locks in "
            f"{TEAMS:,} teams "
            f"swept and evented into SQL in {seconds:.2f}s ({report['duration_ms']:.0f} ms in the "
            f"job); longest single Redis command during it (SLOWLOG): {slowest['duration']} µs "
            f"({name!r})"
        )
