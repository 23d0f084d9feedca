"""kill -9 of Redis mid-storm, then a restart on its AOF (`appendfsync always`)."""

from __future__ import annotations

import asyncio
import time

from tests.support.storm import (
    RedisUnderTest,
    Storm,
    check_after_storm,
    running_app,
    storm_settings,
)


async def test_kill_9_mid_storm_and_restart(
    redis_server: RedisUnderTest, database_url: str
) -> None:
    async with running_app(storm_settings(redis_server.url, database_url)) as (app, client):
        storm = Storm(client)
        await storm.prepare()
        storm.start()
        await storm.wait_calls(300)
        redis_server.kill()
        killed_at, calls_before = time.monotonic(), storm.calls
        await asyncio.sleep(1.5)  # down: every call answers 503
        redis_server.restart()
        down_s = time.monotonic() - killed_at
        await storm.wait_calls(storm.calls + 300)
        await storm.stop()
        figures = await check_after_storm(
            "kill -9", storm, app, client, kills=1, down_s=round(down_s, 2)
        )
    assert figures.answers.get("503 redis_unavailable", 0) > 0, figures  # it was down
    assert storm.calls > calls_before + 300
