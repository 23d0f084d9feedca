"""`teams.version` (migration 0005): the write-behind keeps it at the highest version the
team's recorded events carry, whatever the order or repetition of its batches, so the SQL
answers (an ended team, a listing, a rebuild in Redis) read it instead of the events.

Run on fakeredis and a real redis-server, SQLite and PostgreSQL (the `services` fixture).
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from sqlalchemy import event, select

from groupbuy import errors
from groupbuy.locks.models import TeamRow
from groupbuy.locks.records import (
    TeamRecord,
    parse_event_key,
    parse_team_record,
    project_team_records,
)
from groupbuy.services import Services
from groupbuy.storage.events import EventRow

TEAM_SIZE = 3
LOCK_TTL_S = 20
DEADLINE_S = 90
USERS = 40
ROUNDS = 12
CALLS_PER_ROUND = 40


async def versions_in_events(services: Services) -> dict[tuple[str, str], int]:
    """(activity, team) -> the highest `data.version` of the team's events in SQL: what the
    column stands for, read the slow way (every event, keys parsed)."""
    found: dict[tuple[str, str], int] = {}
    async with services.database.sessions() as session:
        for key, data in await session.execute(select(EventRow.dedup_key, EventRow.data)):
            parsed = parse_event_key(key)
            if parsed is not None:
                team = (parsed.activity_id, parsed.team_id)
                version = int(json.loads(data).get("version", 0))
                found[team] = max(found.get(team, 0), version)
    return found


async def versions_in_rows(services: Services) -> dict[tuple[str, str], int]:
    async with services.database.sessions() as session:
        rows = await session.execute(select(TeamRow.activity_id, TeamRow.team_id, TeamRow.version))
        return {(aid, tid): version for aid, tid, version in rows}


async def _call(services: Services, rng: random.Random, aid: str, teams: list[str]) -> str:
    """One shopper's call: a lock on a named team, a join, an unlock or a confirm."""
    seats = services.teams.seats
    user, tid = f"u{rng.randrange(USERS)}", rng.choice(teams)
    what = rng.random()
    try:
        if what < 0.35:
            await seats.lock(aid, tid, user)
        elif what < 0.55:
            await seats.join(aid, user)
        elif what < 0.65:
            await seats.unlock(aid, tid, user)
        else:
            await seats.confirm(aid, tid, user, f"o-{user}-{tid}")
    except errors.GroupBuyError as refused:  # full, formed, failed, no lock: a shopper's lot
        return type(refused).__name__
    return "ok"


async def _storm(services: Services, seed: int) -> set[str]:
    """Concurrent locks, joins, unlocks and confirms on two activities (one forms short
    teams virtually at the deadline), with time moving so that locks expire and teams fail;
    then every deadline passes and every record reaches SQL. Returns the answers seen."""
    rng = random.Random(seed)
    activities = services.teams.activities
    await activities.create_activity(
        "va", team_size=TEAM_SIZE, lock_ttl_s=LOCK_TTL_S, team_deadline_s=DEADLINE_S
    )
    await activities.create_activity(
        "vb",
        team_size=TEAM_SIZE,
        lock_ttl_s=LOCK_TTL_S,
        team_deadline_s=DEADLINE_S,
        virtual_min_members=2,
    )
    teams: dict[str, list[str]] = {"va": [], "vb": []}
    answers: set[str] = set()
    for round_no in range(ROUNDS):
        for aid in teams:  # new teams keep coming while the first ones end
            tid = f"t{round_no}"
            await activities.open_team(aid, f"lead-{aid}-{round_no}", team_id=tid)
            teams[aid].append(tid)
        calls = [
            _call(services, rng, aid, teams[aid])
            for aid in teams
            for _ in range(CALLS_PER_ROUND // 2)
        ]
        answers |= set(await asyncio.gather(*calls))
        services.clock.advance(rng.choice((1, 7, 15, 25)))
        if round_no % 3 == 2:
            await services.teams.sweeps.expire_locks(100)
            await services.teams.sweeps.expire_due(100)
    services.clock.advance(DEADLINE_S + LOCK_TTL_S)
    await services.teams.sweeps.expire_locks(1000)
    await services.teams.sweeps.expire_due(1000)
    await services.team_writer.drain_all()
    return answers


async def test_the_column_equals_the_events_after_a_storm(services: Services) -> None:
    answers = await _storm(services, seed=20261127)
    assert {"ok", "TeamFull", "LockRequired"} <= answers, answers

    in_rows = await versions_in_rows(services)
    assert len(in_rows) == 2 * ROUNDS
    assert in_rows == await versions_in_events(services)
    assert min(in_rows.values()) >= 2  # opened, then at least its ending

    async with services.database.sessions() as session:
        ended = (await session.scalars(select(TeamRow))).all()
    statuses = {team.status for team in ended}
    assert statuses == {"formed", "failed"}, statuses
    for team in ended:
        # Redis still holds the ended team: its version (locks and unlocks counted too) is
        # the one its last record, the ending, carried.
        live = await services.teams.activities.get_team(team.activity_id, team.team_id)
        assert live["version"] == team.version, (team.activity_id, team.team_id)
        # The listing from SQL answers what the live read answers.
        page = await services.teams.listings.ended_teams(
            team.activity_id, "formed" if team.status == "formed" else "failed", 100
        )
        listed = {body["team_id"]: body for body in page["teams"]}
        assert listed[team.team_id] == live

    # Once Redis let the teams go, the SQL answer is the same body.
    await services.teams.sweeps.release_ended()
    for team in ended:
        assert not await services.redis.exists(services.keys.team(team.activity_id, team.team_id))
        from_sql = await services.teams.activities.get_team(team.activity_id, team.team_id)
        assert from_sql["version"] == team.version


async def test_a_rebuilt_team_counts_on_from_the_column(services: Services) -> None:
    activities, seats = services.teams.activities, services.teams.seats
    await activities.create_activity("r", team_size=4, lock_ttl_s=LOCK_TTL_S)
    await activities.open_team("r", "L", team_id="t1")
    for user in ("u1", "u2"):
        await seats.lock("r", "t1", user)
    await seats.unlock("r", "t1", "u2")  # counted in Redis, recorded nowhere
    await seats.confirm("r", "t1", "u1", "o1")
    before = await activities.get_team("r", "t1")
    assert before["version"] == 5  # opened, lock, lock, unlock, member
    recorded = (await versions_in_rows(services))[("r", "t1")]
    assert recorded == 5 == (await versions_in_events(services))[("r", "t1")]

    team = services.keys.team_keys("r", "t1")
    await services.redis.delete(team.hash, team.members, team.locks)  # Redis lost the team
    rebuilt = await activities.get_team("r", "t1")
    assert rebuilt["version"] == recorded + 1
    assert [m["user_id"] for m in rebuilt["members"]] == ["L", "u1"]
    await seats.lock("r", "t1", "u3")
    await seats.confirm("r", "t1", "u3", "o3")
    assert (await versions_in_rows(services))[("r", "t1")] == recorded + 3


def _record(kind: str, version: int, **more: str) -> TeamRecord:
    fields = {"type": kind, "at_ms": str(1_000 + version), "activity_id": "a", "team_id": "t"}
    return parse_team_record({**fields, **more, "version": str(version)})


async def test_a_late_or_repeated_batch_never_lowers_the_version(services: Services) -> None:
    await services.teams.activities.create_activity("a", team_size=3)
    opened = _record("team.opened", 1, leader_id="L", order_id="", size="3", deadline_ms="999999")
    joined = _record("team.member_joined", 3, user_id="u1", order_id="o1", seq="2")
    expired = _record("lock.expired", 4, user_id="u2", locked_at_ms="1000")
    old: dict[str, Any] = {"type": "lock.expired", "at_ms": "900", "activity_id": "a"}
    unversioned = parse_team_record({**old, "team_id": "t", "user_id": "u0", "locked_at_ms": "1"})
    batches = [[opened, joined], [expired], [opened, joined], [unversioned], [joined]]
    seen = []
    for batch in batches:
        async with services.database.transaction() as session:
            await project_team_records(session, batch)
        seen.append((await versions_in_rows(services))[("a", "t")])
    assert seen == [3, 4, 4, 4, 4]


async def test_a_page_of_ended_teams_is_three_statements_whatever_its_size(
    services: Services,
) -> None:
    activities, seats = services.teams.activities, services.teams.seats
    await activities.create_activity("p", team_size=2)
    for n in range(6):
        await activities.open_team("p", f"L{n}", team_id=f"t{n}")
        await seats.lock("p", f"t{n}", f"u{n}")
        await seats.confirm("p", f"t{n}", f"u{n}", f"o{n}")
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    engine = services.database.engine.sync_engine
    event.listen(engine, "after_cursor_execute", count)
    try:
        page = await services.teams.listings.ended_teams("p", "formed", 100)
    finally:
        event.remove(engine, "after_cursor_execute", count)
    assert [t["team_id"] for t in page["teams"]] == [f"t{n}" for n in reversed(range(6))]
    assert all(t["version"] == 4 for t in page["teams"])  # opened, lock, member, formed
    assert len(statements) == 3, statements  # the activity, the teams, their members
