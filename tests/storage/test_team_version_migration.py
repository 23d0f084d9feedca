"""Revision 0005 on a database holding teams and their events written before it, on SQLite
and PostgreSQL: each team gets the highest version its events carry (0 when none does),
matched by the event's key exactly (ids with `_`, ids that start another id), and a
write after the upgrade goes on from there."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from groupbuy import migrations
from groupbuy.locks.models import TeamRow
from groupbuy.locks.records import parse_team_record, project_team_records
from groupbuy.storage.db import Database
from groupbuy.storage.events import record_events
from tests.support.database import throwaway_postgres
from tests.support.feed import DATABASES, database_url
from tests.support.postgres import PostgresProcess

WHEN = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
TEAMS = ("t1", "t10", "t_1", "tx1", "plain", "quiet")
# (dedup key, data): every kind of team event; `t1`'s keys are prefixes of `t10`'s, and
# LIKE's `_` in `t_1` matches `tx1`; `plain`'s events come from before versions; another
# engine's event carries a version of its own.
OLD_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("team.opened:a:t1", {"version": 1}),
    ("team.member_joined:a:t1:u1", {"version": 4}),
    ("lock.expired:a:t1:u2:1700000000000", {"version": 6}),
    ("team.formed:a:t1", {"version": 5}),  # a late record: the highest version wins
    ("team.opened:a:t10", {"version": 1}),
    ("team.member_joined:a:t10:u1", {"version": 9}),
    ("team.failed:a:t10", {"version": 12}),
    ("team.opened:a:t_1", {"version": 1}),
    ("team.opened:a:tx1", {"version": 1}),
    ("lock.expired:a:tx1:u3:1700000000000", {"version": 3}),
    ("team.opened:a:plain", {}),
    ("team.member_joined:a:plain:u1", {}),
    ("packet.sold_out:p1", {"version": 40}),
]
EXPECTED = {"t1": 6, "t10": 12, "t_1": 1, "tx1": 3, "plain": 0, "quiet": 0}


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresProcess]:
    yield from throwaway_postgres()


@pytest.fixture(params=DATABASES)
async def at_0004(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """A database at revision 0004 holding an activity, its teams and their events, written
    through 0004's tables (teams have no version yet)."""
    database = Database(database_url(str(request.param), tmp_path, request))
    await migrations.upgrade(database, "0004")
    activities = sa.table(
        "activities",
        *(sa.column(c) for c in ("activity_id", "team_size", "lock_ttl_s", "team_deadline_s")),
        sa.column("created_at"),
    )
    teams = sa.table(
        "teams",
        *(sa.column(c) for c in ("activity_id", "team_id", "leader_id", "status", "size")),
        *(sa.column(c) for c in ("created_at", "deadline_at", "redis_cleared")),
    )
    events = sa.table(
        "events", *(sa.column(c) for c in ("type", "at", "dedup_key", "data", "position"))
    )
    async with database.engine.begin() as connection:
        await connection.execute(
            activities.insert().values(
                activity_id="a", team_size=3, lock_ttl_s=60, team_deadline_s=600, created_at=WHEN
            )
        )
        await connection.execute(
            teams.insert(),
            [
                {
                    "activity_id": "a",
                    "team_id": tid,
                    "leader_id": "L",
                    "status": "open",
                    "size": 3,
                    "created_at": WHEN,
                    "deadline_at": WHEN,
                    "redis_cleared": False,
                }
                for tid in TEAMS
            ],  # fmt: skip
        )
        await connection.execute(
            events.insert(),
            [
                {
                    "type": key.split(":")[0],
                    "at": WHEN,
                    "dedup_key": key,
                    "data": json.dumps(data),
                    "position": n,
                }
                for n, (key, data) in enumerate(OLD_EVENTS, 1)
            ],  # fmt: skip
        )
    try:
        yield database
    finally:
        await database.dispose()


async def _versions(database: Database) -> dict[str, int]:
    async with database.sessions() as session:
        rows = await session.execute(select(TeamRow.team_id, TeamRow.version))
        return {team_id: version for team_id, version in rows}


async def test_0005_gives_each_team_the_version_of_its_events(at_0004: Database) -> None:
    database = at_0004
    moved = await migrations.upgrade(database)
    assert (moved.before, moved.after) == ("0004", migrations.head())
    assert await _versions(database) == EXPECTED

    # A record applied after the upgrade (as the write-behind does) goes on from there.
    joined = {"type": "team.member_joined", "at_ms": "1793707200000", "activity_id": "a"}
    record = {**joined, "team_id": "t1", "user_id": "u9", "order_id": "", "seq": "2"}
    async with database.transaction() as session:
        applied = [parse_team_record({**record, "version": "7"})]
        await record_events(session, await project_team_records(session, applied))
    assert (await _versions(database))["t1"] == 7

    # Down and up again: the backfill gives the same versions (t1's event is there now).
    await migrations.downgrade(database, "0004")
    await migrations.upgrade(database)
    assert await _versions(database) == {**EXPECTED, "t1": 7}
