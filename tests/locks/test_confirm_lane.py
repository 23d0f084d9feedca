"""Confirms do not queue behind bulk writes: their records share group-commit rounds and,
on SQLite, take the writer's turn before bulk transactions waiting for it."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

from groupbuy.locks.models import MemberRow
from groupbuy.services import Services

ACTIVITIES = 5


async def _locked(services: Services, activities: int) -> None:
    """Activities a0.. with a team t1 each and user u locking a seat in it."""
    for a in range(activities):
        await services.teams.activities.create_activity(f"a{a}", team_size=3)
        await services.teams.activities.open_team(f"a{a}", "L", team_id="t1")
        await services.teams.seats.lock(f"a{a}", "t1", "u")


async def _members(services: Services) -> int:
    async with services.database.sessions() as session:
        count = await session.scalar(select(func.count()).select_from(MemberRow))
    assert count is not None
    return count


def _slow_first_round(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[int], asyncio.Event, asyncio.Event]:
    """Make the team writer's first transaction wait: (the sizes of its transactions, in
    records projected; set once the first one writes; set it to let the first one go)."""
    writer = services.team_writer
    real_write = writer._write
    projected: list[int] = []
    writing, release = asyncio.Event(), asyncio.Event()

    async def slow_write(records: list[dict[str, str]]) -> None:
        projected.append(len(records))
        if len(projected) == 1:
            writing.set()
            await release.wait()
        await real_write(records)

    monkeypatch.setattr(writer, "_write", slow_write)
    return projected, writing, release


async def test_activities_share_rounds_on_sqlite_and_not_on_postgresql(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five confirms of five activities while the first one's transaction writes: on SQLite
    (one writer) the four others are committed together in the round after it; on
    PostgreSQL each activity has its own lane, and the four are answered meanwhile."""
    await _locked(services, ACTIVITIES)
    projected, writing, release = _slow_first_round(services, monkeypatch)
    first = asyncio.create_task(services.teams.seats.confirm("a0", "t1", "u", "o"))
    await asyncio.wait_for(writing.wait(), 10)
    others = [
        asyncio.create_task(services.teams.seats.confirm(f"a{a}", "t1", "u", "o"))
        for a in range(1, ACTIVITIES)
    ]
    if services.database.is_sqlite:
        await asyncio.sleep(0.1)
        assert not any(task.done() for task in others)  # behind the one writer
        release.set()
        answers = await asyncio.gather(first, *others)
        assert projected == [1, ACTIVITIES - 1]  # two transactions, not five
    else:
        done, _ = await asyncio.wait(others, timeout=10)
        assert len(done) == ACTIVITIES - 1 and not first.done()
        release.set()
        answers = await asyncio.gather(first, *others)
        assert projected == [1] * ACTIVITIES
    assert all(answer.created for answer in answers)
    assert await _members(services) == ACTIVITIES * 2  # leaders and the confirmed users


async def test_confirms_of_one_activity_share_a_round(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five users of one activity confirm while a transaction of it writes: the five are
    committed together in the round after it."""
    await services.teams.activities.create_activity("a0", team_size=10)
    await services.teams.activities.open_team("a0", "L", team_id="t1")
    await services.teams.activities.open_team("a0", "M", team_id="t2")
    users = [f"u{n}" for n in range(5)]
    for user in users:
        await services.teams.seats.lock("a0", "t1", user)
    await services.teams.seats.lock("a0", "t2", "first")
    projected, writing, release = _slow_first_round(services, monkeypatch)
    first = asyncio.create_task(services.teams.seats.confirm("a0", "t2", "first", "o"))
    await asyncio.wait_for(writing.wait(), 10)
    others = [
        asyncio.create_task(services.teams.seats.confirm("a0", "t1", user, f"o{user}"))
        for user in users
    ]
    await asyncio.sleep(0.1)
    assert not any(task.done() for task in others)  # the record is not in SQL yet
    release.set()
    answers = await asyncio.gather(first, *others)
    assert all(answer.created for answer in answers)
    assert projected == [1, len(users)]


async def test_a_confirm_goes_before_bulk_writers_waiting_on_sqlite(services: Services) -> None:
    """A bulk transaction writes, two more wait for SQLite's writer; a confirm arriving
    after them is committed before either of them gets its turn."""
    if not services.database.is_sqlite:
        pytest.skip("SQLite's single writer: PostgreSQL writers do not take turns")
    await _locked(services, 1)
    database = services.database
    writing, release = asyncio.Event(), asyncio.Event()
    seen: list[int] = []

    async def write(hold: bool) -> None:
        async with database.transaction() as session:
            members = await session.scalar(select(func.count()).select_from(MemberRow))
            seen.append(members or 0)
            if hold:
                writing.set()
                await release.wait()

    holder = asyncio.create_task(write(True))
    await writing.wait()
    waiting = [asyncio.create_task(write(False)) for _ in range(2)]
    await asyncio.sleep(0.05)  # both queued for the writer's turn
    confirm = asyncio.create_task(services.teams.seats.confirm("a0", "t1", "u", "o"))
    await asyncio.sleep(0.05)  # the confirm's round waits for the turn too
    release.set()
    answer = await asyncio.wait_for(confirm, 10)
    await asyncio.gather(holder, *waiting)
    assert answer.created
    assert seen == [1, 2, 2]  # the queued bulk writers saw the confirmed member
