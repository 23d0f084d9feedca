"""The write-behind killed between its SQL commit and its acknowledgement, again and again
mid-storm: another consumer takes the batch over and applies it again harmlessly."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.support.storm import (
    RedisUnderTest,
    Storm,
    check_after_storm,
    running_app,
    services_of,
    storm_settings,
)

KILLS = 5
# The most the storm goes on, after its first 1,200 calls, for the kills to happen.
KILLS_WITHIN_S = 60


class Killed(Exception):
    """Stands for the writer's process dying at that point (after the commit, before XACK)."""


async def test_writer_killed_between_commit_and_ack(
    redis_server: RedisUnderTest, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dead consumer's batch is taken over once it has been idle this long.
    settings = storm_settings(
        redis_server.url, database_url, GROUPBUY_REDPACKETS_RECLAIM_IDLE_S="1"
    )
    async with running_app(settings) as (app, client):
        services = services_of(app)
        writer = services.packets.writer
        real_ack = writer.ack
        kills, acks = 0, 0

        async def ack_or_die(packet_id: str, ids: list[str], ended: bool = False) -> int:
            nonlocal kills, acks
            if ids:
                acks += 1
                if kills < KILLS and acks % 3 == 0:
                    kills += 1
                    # The process that comes back is another consumer of the group: the
                    # batch of the dead one waits until XAUTOCLAIM takes it over.
                    writer.consumer = f"restarted-{kills}"
                    raise Killed()
            return await real_ack(packet_id, ids, ended)

        monkeypatch.setattr(writer, "ack", ack_or_die)
        storm = Storm(client)
        await storm.prepare()
        storm.start()
        await storm.wait_calls(1200)
        # How many batches 1,200 calls make depends on how fast the write-behind runs beside
        # them (12 acknowledgements, 4 kills, in one CI run): the storm goes on until every
        # kill has happened.
        deadline = time.monotonic() + KILLS_WITHIN_S
        while kills < KILLS:
            assert time.monotonic() < deadline, f"{kills} kills in {acks} acknowledgements"
            await asyncio.sleep(0.05)
        await storm.stop()
        assert kills == KILLS, (kills, acks)
        figures = await check_after_storm("writer killed", storm, app, client, kills=kills)
        stuck: list[Any] = []
        for packet_id in storm.packet_ids:
            stream = services.keys.packet_outbox(packet_id)
            summary = await services.redis.xpending(stream, "writers")
            if summary["pending"]:
                stuck.append((packet_id, summary))
    assert not stuck, stuck  # every batch of a dead consumer was taken over and acknowledged
    assert figures.grabbed > 0
