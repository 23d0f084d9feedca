"""SQL locked for 40 s mid-storm (an exclusive SQLite write lock held by another
connection): grabs go on answering from Redis, the write-behind backs up, then drains.

SQLite only: the fault is SQLite's file lock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.support.database import sqlite_file, sqlite_url
from tests.support.sql_outage import exclusive_lock
from tests.support.storm import (
    RedisUnderTest,
    Storm,
    check_after_storm,
    running_app,
    services_of,
    storm_settings,
)

LOCKED_S = 40


@pytest.mark.slow
async def test_sql_locked_40_s_mid_storm(redis_server: RedisUnderTest, tmp_path: Path) -> None:
    settings = storm_settings(redis_server.url, sqlite_url(tmp_path))
    async with running_app(settings) as (app, client):
        storm = Storm(client, rate=100)
        await storm.prepare()
        storm.start()
        await storm.wait_calls(200)
        locker = await exclusive_lock(sqlite_file(tmp_path))
        locked_at, grabbed_before = time.monotonic(), len(storm.grabs)
        await asyncio.sleep(LOCKED_S / 2)
        waiting_mid_lock = await services_of(app).packets.writer.backlog()
        await asyncio.sleep(LOCKED_S / 2)
        grabbed_while_locked = len(storm.grabs) - grabbed_before
        locker.execute("ROLLBACK")
        locker.close()
        locked_s = time.monotonic() - locked_at
        await storm.wait_calls(storm.calls + 200)
        await storm.stop()
        figures = await check_after_storm(
            "SQL locked",
            storm,
            app,
            client,
            locked_s=round(locked_s, 1),
            grabbed_while_locked=grabbed_while_locked,
            waiting_mid_lock=waiting_mid_lock,
        )
    assert grabbed_while_locked > 1000, grabbed_while_locked  # answered from Redis meanwhile
    # The write-behind backed up (check_after_storm then saw it drain). The backlog gauge
    # is not checked here: when it is refreshed depends on which writer meets the lock
    # first and waits out SQLite's 30 s busy timeout (tests/test_metrics.py checks it).
    assert waiting_mid_lock > 500, waiting_mid_lock
    assert figures.grabbed > grabbed_while_locked
