"""Team changes reach SQL through the outbox: exactly once, also after failures."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import func, select

from groupbuy import errors
from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.services import Services
from groupbuy.storage.db import DatabaseUnreachable
from groupbuy.storage.events import EventRow


async def _count(services: Services, model: Any) -> int:
    async with services.database.sessions() as session:
        rows = await session.scalar(select(func.count()).select_from(model))
    assert rows is not None
    return rows


async def _event_types(services: Services) -> list[str]:
    async with services.database.sessions() as session:
        return list((await session.scalars(select(EventRow.type).order_by(EventRow.id))).all())


async def _formed_team(services: Services) -> None:
    teams = services.teams
    await teams.activities.create_activity("a1", team_size=2)
    await teams.activities.open_team("a1", "L", team_id="t1", order_id="oL")
    await teams.seats.lock("a1", "t1", "u1")
    await teams.seats.confirm("a1", "t1", "u1", "o1")
    await services.team_writer.drain("a1")  # the confirm's round has acknowledged its entries


async def test_open_and_confirm_are_recorded_at_once(services: Services) -> None:
    await _formed_team(services)
    assert await _event_types(services) == ["team.opened", "team.member_joined", "team.formed"]
    async with services.database.sessions() as session:
        team = await session.get(TeamRow, ("a1", "t1"))
        members = (await session.scalars(select(MemberRow).order_by(MemberRow.seq))).all()
    assert team is not None and team.status == "formed" and team.formed_at is not None
    assert [(m.user_id, m.order_id, m.seq) for m in members] == [("L", "oL", 1), ("u1", "o1", 2)]
    assert not await services.redis.exists(services.keys.outbox("a1"))


async def test_lock_expiry_is_recorded_by_the_writer(services: Services) -> None:
    teams = services.teams
    await teams.activities.create_activity("a1", lock_ttl_s=5)
    await teams.activities.open_team("a1", "L", team_id="t1")
    await teams.seats.lock("a1", "t1", "u1")
    services.clock.advance(5)
    await teams.activities.get_team("a1", "t1")  # the lazy check notices the expiry
    assert await services.team_writer.drain("a1") == 1
    assert await _event_types(services) == ["team.opened", "lock.expired"]
    assert await services.team_writer.drain("a1") == 0


async def test_a_failed_batch_stays_in_redis_and_lands_once_later(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    teams = services.teams
    await teams.activities.create_activity("a1", team_size=3)
    await teams.activities.open_team("a1", "L", team_id="t1")
    await teams.seats.lock("a1", "t1", "u1")
    await teams.seats.lock("a1", "t1", "u2")

    calls = {"n": 0}
    real_write = services.team_writer._write

    async def dying_write(batch: list[dict[str, str]]) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # the database goes away on the second batch, before its commit
            raise DatabaseUnreachable("[Errno 111] Connect call failed")
        await real_write(batch)

    monkeypatch.setattr(services.team_writer, "_write", dying_write)
    await teams.seats.confirm("a1", "t1", "u1", "o1")  # its record lands (batch 1)
    # Not answered while its record is not in SQL (the API answers 503 database_unavailable);
    # the script made u2 a member and the team formed, in Redis, with the records waiting.
    with pytest.raises(DatabaseUnreachable):
        await teams.seats.confirm("a1", "t1", "u2", "o2")
    assert await services.redis.xlen(services.keys.outbox("a1")) == 2
    assert await _count(services, MemberRow) == 2
    monkeypatch.setattr(services.team_writer, "_write", real_write)

    repeat = await teams.seats.confirm("a1", "t1", "u2", "o2")  # the backend's retry: recorded now
    assert not repeat.created and repeat.body["formed"] is True
    # answered once committed; the round acknowledged the entries after (a drain waits)
    assert await services.team_writer.drain("a1") == 0
    assert await services.redis.xlen(services.keys.outbox("a1")) == 0
    assert await _event_types(services) == [
        "team.opened",
        "team.member_joined",
        "team.member_joined",
        "team.formed",
    ]
    assert await _count(services, MemberRow) == 3


@pytest.mark.parametrize("batch", [10, 500])
async def test_a_flush_ends_while_the_activity_keeps_writing(
    services: Services, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """A flush applies what the stream held when it began and returns: an activity that
    keeps writing faster than SQL takes its records (several replicas writing one
    database) must not hold up the flush, nor every confirm and job that waits on it, for
    as long as its writes go on. Later entries are the next flush's."""
    await services.teams.activities.create_activity("a1")
    await services.teams.activities.open_team(
        "a1", "L", team_id="t1"
    )  # flushed: the stream is empty
    stream = services.keys.outbox("a1")
    real_write = services.team_writer._write

    async def slow_write(batch: list[dict[str, str]]) -> None:
        await asyncio.sleep(0.02)
        await real_write(batch)

    monkeypatch.setattr(services.team_writer, "_write", slow_write)
    monkeypatch.setattr(services.team_writer, "_batch_size", batch)  # 10: several batches
    written = 0
    stop = asyncio.Event()

    async def write() -> None:
        nonlocal written
        while not stop.is_set():
            expired = {"type": "lock.expired", "at_ms": str(1000 + written)}
            where = {"activity_id": "a1", "team_id": "t1", "user_id": f"u{written}"}
            await services.redis.xadd(stream, {**expired, **where, "locked_at_ms": "1"})
            written += 1
            await asyncio.sleep(0.001)

    writing = asyncio.create_task(write())
    try:
        await asyncio.sleep(0.2)
        there = written
        applied = await asyncio.wait_for(services.team_writer.drain("a1"), timeout=10)
        assert not writing.done()  # it returned while the writes went on
    finally:
        stop.set()
        await writing
        await services.team_writer.drain("a1")  # the rest, and nothing left running at the end
    assert there <= applied < written
    async with services.database.sessions() as session:
        keys = set(await session.scalars(select(EventRow.dedup_key)))
    assert len([key for key in keys if key.startswith("lock.expired")]) == written


async def test_entries_applied_twice_record_once(services: Services) -> None:
    """A writer that committed but died before deleting the entries: the rerun is a no-op."""
    await _formed_team(services)
    stream = services.keys.outbox("a1")
    assert await _count(services, EventRow) == 3
    # Put two already-recorded facts back in the stream, as if their delete never ran.
    await services.redis.xadd(
        stream,
        {
            "type": "team.formed",
            "at_ms": "1",
            "activity_id": "a1",
            "team_id": "t1",
            "members": "L|oL,u1|o1",
        },
    )
    await services.redis.xadd(
        stream,
        {
            "type": "team.member_joined",
            "at_ms": "1",
            "activity_id": "a1",
            "team_id": "t1",
            "user_id": "u1",
            "order_id": "o1",
            "seq": "2",
        },
    )
    assert await services.team_writer.drain("a1") == 2
    assert await _count(services, EventRow) == 3
    assert await _count(services, MemberRow) == 2


async def test_team_read_falls_back_to_sql_after_redis_let_go(services: Services) -> None:
    await _formed_team(services)
    live = await services.teams.activities.get_team("a1", "t1")
    for key in services.keys.team_keys("a1", "t1").named().values():
        await services.redis.delete(key)
    recorded = await services.teams.activities.get_team("a1", "t1")
    assert recorded == live
    with pytest.raises(errors.TeamFormed):
        await services.teams.seats.lock("a1", "t1", "u9")
    with pytest.raises(errors.TeamFormed):
        await services.teams.seats.confirm("a1", "t1", "u9", "o9")


async def test_a_repeated_confirm_after_redis_let_the_team_go_answers_the_same(
    services: Services,
) -> None:
    """A confirm sent again once the formed team is only in SQL (its answer was lost, or was
    a 503 while SQL was away): the same answer as the first, not team_formed."""
    await _formed_team(services)
    first = await services.teams.seats.confirm("a1", "t1", "u1", "o1")
    assert first.body["formed"] is True
    await services.teams.sweeps.release_ended()
    assert not await services.redis.exists(services.keys.team_keys("a1", "t1").hash)
    again = await services.teams.seats.confirm("a1", "t1", "u1", "o1")
    assert (again.body, again.created) == (first.body, False)
    with pytest.raises(errors.TeamFormed):  # another order of the same user is not a repeat
        await services.teams.seats.confirm("a1", "t1", "u1", "o2")
    leader = await services.teams.seats.confirm("a1", "t1", "L", "oL")  # as Redis answers it
    assert (leader.body["formed"], leader.created) == (False, False)


async def test_activity_lost_by_redis_is_restored_from_sql(services: Services) -> None:
    await services.teams.activities.create_activity("a1", team_size=4)
    await services.redis.delete(services.keys.activity("a1"))
    outcome = await services.teams.activities.open_team("a1", "L", team_id="t1")
    assert outcome.created and outcome.body["size"] == 4


async def test_unknown_activity_and_team(services: Services) -> None:
    with pytest.raises(errors.ActivityNotFound):
        await services.teams.activities.get_team("nope", "t1")
    with pytest.raises(errors.ActivityNotFound):
        await services.teams.seats.lock("nope", "t1", "u1")
    with pytest.raises(errors.ActivityNotFound):
        await services.teams.activities.open_team("nope", "L")
    await services.teams.activities.create_activity("a1")
    with pytest.raises(errors.TeamNotFound):
        await services.teams.seats.lock("a1", "t1", "u1")
    with pytest.raises(errors.TeamNotFound):
        await services.teams.seats.unlock("a1", "t1", "u1")


async def test_team_records_are_found_without_reading_every_activity(
    services: Services,
) -> None:
    from tests.support.counting import sql_statements

    teams = services.teams
    for i in range(20):
        await teams.activities.create_activity(f"a{i}", lock_ttl_s=5)
        await teams.activities.open_team(f"a{i}", "L", team_id="t1")
    await teams.seats.lock("a7", "t1", "u1")
    services.clock.advance(5)
    await teams.activities.get_team("a7", "t1")  # the lazy check records the lock's expiry
    pending = services.keys.pending_activities()
    assert await services.redis.zrange(pending, 0, -1) == ["a7"]
    with sql_statements(services.database) as statements:
        assert await services.team_writer.drain_all() == 1
    assert statements and not any("FROM activities" in s for s in statements), statements
    assert await services.redis.zrange(pending, 0, -1) == []
    assert await _event_types(services) == 20 * ["team.opened"] + ["lock.expired"]
    assert await services.team_writer.drain_all() == 0


async def test_a_lost_pending_entry_of_an_activity_is_found_again_by_the_repair(
    services: Services,
) -> None:
    teams = services.teams
    await teams.activities.create_activity("a1", lock_ttl_s=5)
    await teams.activities.open_team("a1", "L", team_id="t1")
    await teams.seats.lock("a1", "t1", "u1")
    services.clock.advance(5)
    await teams.activities.get_team("a1", "t1")
    await services.redis.zrem(services.keys.pending_activities(), "a1")  # the entry is lost
    assert await services.team_writer.drain_all() == 0
    assert await teams.sweeps.reindex() == {"activities_reindexed": 1, "teams_restored": 0}
    assert await services.team_writer.drain_all() == 1
    assert await _event_types(services) == ["team.opened", "lock.expired"]
