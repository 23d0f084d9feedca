"""Background rounds find their work through indexes: what is idle costs them nothing.

With many live packets and activities that have nothing waiting and nothing due, each job
round reads its indexes and stops: a fixed handful of Redis commands and no SQL at all,
however many there are. Counted on a real redis-server (its own command counter, which
also counts the commands a script runs), so a round that visited every packet or
activity (three commands each) could not pass.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from groupbuy.services import Services
from tests.support.counting import commands_processed, sql_statements

pytestmark = [pytest.mark.parametrize("backend", [pytest.param("real", marks=pytest.mark.real)])]

PACKETS = 200
ACTIVITIES = 50
# What one idle round may send: flush_records reads the two pending indexes and measures
# the backlog (one pipeline of two reads); a sweep reads Redis's clock and its due index.
MOST_COMMANDS = {"flush_records": 4, "sweep_locks": 2, "expire_teams": 2, "expire_packets": 2}


async def idle_world(services: Services) -> None:
    """Live packets nobody grabs, activities whose open team holds a live lock, all
    recorded: nothing waits and nothing is due."""
    packets, teams = services.packets, services.teams
    await packets.accounts.deposit("sender", PACKETS * 10, "funds")
    gate = asyncio.Semaphore(16)

    async def send(i: int) -> None:
        async with gate:
            await packets.sending.send("sender", 10, 2, packet_id=f"idle{i}")

    async def activity(i: int) -> None:
        async with gate:
            await teams.activities.create_activity(f"a{i}", team_size=3)
            await teams.activities.open_team(f"a{i}", "L", team_id="t1")
            await teams.seats.lock(f"a{i}", "t1", "u1")

    await asyncio.gather(*(send(i) for i in range(PACKETS)))
    await asyncio.gather(*(activity(i) for i in range(ACTIVITIES)))
    for job in MOST_COMMANDS:
        await services.jobs.run(job)


async def test_an_idle_round_costs_a_few_commands_and_no_sql(
    services: Services, redis_client: Any
) -> None:
    await idle_world(services)
    keys = services.keys
    # the indexes know every live thing (so a round that visited them had work to do)
    assert await redis_client.zcard(keys.due_packets()) == PACKETS
    assert await redis_client.zcard(keys.due_locks()) == ACTIVITIES
    assert await redis_client.zcard(keys.due_deadlines()) == ACTIVITIES
    for job, most in MOST_COMMANDS.items():
        with sql_statements(services.database) as statements:
            before = await commands_processed(redis_client)
            report = await services.jobs.run(job)
            sent = await commands_processed(redis_client) - before
        assert sent <= most, (job, sent, report)
        assert statements == [], (job, statements)


async def test_a_round_with_work_visits_only_what_has_work(
    services: Services, redis_client: Any
) -> None:
    await idle_world(services)
    await services.packets.grabs.grab("idle7", "g1")
    await services.teams.seats.unlock("a3", "t1", "u1")
    await services.teams.seats.confirm("a4", "t1", "u1", "o1")  # recorded at once, by the confirm
    await services.team_writer.drain("a4")  # and acknowledged by its round, after the answer
    with sql_statements(services.database) as statements:
        before = await commands_processed(redis_client)
        report = await services.jobs.run("flush_records")
        sent = await commands_processed(redis_client) - before
    assert report["packet_records"] == 1 and report["team_records"] == 0
    # the indexes read once and one packet drained: two passes of its three group reads,
    # the ack (a script: its XACK, XDEL, XLEN and ZREM count too), and the backlog's two
    # reads; nowhere near a command per live packet or activity
    assert sent <= 15, (sent, report)
    assert not any("FROM activities" in s or "FROM packets\n" in s for s in statements), statements
