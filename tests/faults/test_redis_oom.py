"""Redis over maxmemory mid-storm (noeviction): grabs and joins answer 503
redis_out_of_memory with nothing applied, and everything works again once memory is back."""

from __future__ import annotations

import asyncio

from tests.support.storm import (
    OutOfMemoryNotRefused,
    RedisUnderTest,
    Storm,
    check_after_storm,
    running_app,
    storm_settings,
)


async def test_out_of_memory_mid_storm(redis_server: RedisUnderTest, database_url: str) -> None:
    admin = redis_server.client()
    async with running_app(storm_settings(redis_server.url, database_url)) as (app, client):
        storm = Storm(client)
        await storm.prepare()
        storm.start()
        await storm.wait_calls(300)
        assert admin.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        admin.config_set("maxmemory", "1")  # below what it uses: every denied write is refused
        await asyncio.sleep(1.5)
        admin.config_set("maxmemory", "0")
        await storm.wait_calls(storm.calls + 300)
        await storm.stop()
        # Judged last, so that every other check runs whatever they are.
        internal_errors, storm.unexpected = storm.unexpected, []
        figures = await check_after_storm("OOM", storm, app, client, oom_s=1.5)
    admin.close()
    if internal_errors:
        raise OutOfMemoryNotRefused(len(internal_errors), internal_errors[:3])
    assert figures.answers.get("503 redis_out_of_memory", 0) > 0, figures
    # Nothing a 503 redis_out_of_memory answered was applied: its retry grabbed anew.
    again = [key for key in storm.told_oom if storm.grab_final[key] == "already_grabbed"]
    assert not again, again[:5]
