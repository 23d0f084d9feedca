"""SCRIPT FLUSH again and again mid-storm: calls reload their script and carry on."""

from __future__ import annotations

import asyncio

from tests.support.storm import (
    RedisUnderTest,
    Storm,
    check_after_storm,
    running_app,
    storm_settings,
)


async def test_script_flush_repeatedly_mid_storm(
    redis_server: RedisUnderTest, database_url: str
) -> None:
    admin = redis_server.client()
    async with running_app(storm_settings(redis_server.url, database_url)) as (app, client):
        storm = Storm(client)
        await storm.prepare()
        storm.start()
        await storm.wait_calls(300)
        flushes = 0
        for _ in range(30):  # every 100 ms for 3 s
            admin.script_flush()
            flushes += 1
            await asyncio.sleep(0.1)
        await storm.wait_calls(storm.calls + 300)
        await storm.stop()
        admin.script_flush()  # and once more at the end: readiness must load them again
        figures = await check_after_storm("SCRIPT FLUSH", storm, app, client, flushes=flushes + 1)
    admin.close()
    assert set(figures.answers) <= {"grabbed", "locked", "no_team_available"}, figures
