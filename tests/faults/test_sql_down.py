"""SQL unavailable for a few seconds mid-storm, on both databases: PostgreSQL killed with
`pg_ctl stop -m immediate` and started again, SQLite's write lock held by another
connection (`[database] timeout_s` 2 s).

Grabs and seat joins go on from Redis. Every call that needs SQL answers 503
`database_unavailable` while it is away (on SQLite the writes; its readers are not
blocked), never a 500. No confirm answers 2xx unless its membership is in SQL: the
members SQL held when the outage ended are read where the service cannot write, and
every confirm answered 2xx by then must be among them. The writes answered 503 are
retried afterwards with the same ids, as a backend does, and succeed; then every grab
told `grabbed` is one grab row and one credit, every confirmed user is a member with the
order that paid, every deposit and send is recorded once, and money is conserved."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import select

from groupbuy.locks.models import MemberRow
from groupbuy.redpacket.codec import deposit_key
from groupbuy.redpacket.models import LedgerEntryRow, PacketRow
from groupbuy.storage.db import Database
from tests.support.database import create_schema, sqlite_file, sqlite_url, start_postgres_or_skip
from tests.support.postgres import USER
from tests.support.settings import TEST_RATE_LIMITS
from tests.support.sql_outage import (
    ACTIVITY,
    READS,
    SQL_DOWN,
    WRITES,
    Outage,
    PostgresCrash,
    SqlCalls,
    SqliteLock,
)
from tests.support.storm import (
    RedisUnderTest,
    Storm,
    check_after_storm,
    running_app,
    services_of,
    storm_settings,
)


@dataclass(frozen=True)
class Sql:
    """A database under test: its URL, how it is made unavailable, for how long, and the
    service's settings for it."""

    url: str
    outage: Outage
    down_s: float
    env: dict[str, str] = field(default_factory=dict)


@pytest.fixture(params=["sqlite", "postgresql"])
async def sql(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Sql]:
    if request.param == "sqlite":
        # A writer waits up to 2 s for its turn, then up to 2 s for the lock: 8 s away
        # leaves every writing lane a whole call inside the outage. (After it, the slowest
        # write took 0.4-0.9 s while the backlog drained, under a load average of 4-5.)
        lock = SqliteLock(sqlite_file(tmp_path))
        yield Sql(sqlite_url(tmp_path), lock, 8.0, {"GROUPBUY_DATABASE_TIMEOUT_S": "2"})
        return
    import asyncpg

    server = start_postgres_or_skip()
    try:
        url = server.create_database("groupbuy")
        # The throwaway cluster commits asynchronously (cheap, for tests that never crash
        # it); a crash of PostgreSQL loses such commits, and the write-behind has already
        # deleted their records from Redis. This database commits as production's must.
        admin = await asyncpg.connect(
            host="127.0.0.1", port=server.port, user=USER, database="postgres"
        )
        try:
            await admin.execute("ALTER DATABASE groupbuy SET synchronous_commit TO on")
        finally:
            await admin.close()
        database = Database(url)
        try:
            await create_schema(database)
        finally:
            await database.dispose()
        yield Sql(url, PostgresCrash(server, "groupbuy"), 5.0)
    finally:
        server.stop()


async def test_sql_down_mid_storm(redis_server: RedisUnderTest, sql: Sql) -> None:
    outage = sql.outage
    settings = storm_settings(redis_server.url, sql.url, **sql.env, **TEST_RATE_LIMITS)
    async with running_app(settings) as (app, client):
        grabs = Storm(client, callers=4, rate=80, join_share=0.0, teams=0)
        calls = SqlCalls(client)
        await grabs.prepare()
        await calls.prepare()
        grabs.start()
        calls.start()
        await grabs.wait_calls(100)
        began = time.monotonic()
        await outage.stop()
        down = time.monotonic()
        grabbed_before = len(grabs.grabs)
        await asyncio.sleep(sql.down_s)
        grabbed_while_down = len(grabs.grabs) - grabbed_before
        members_at_end = await outage.snapshot()
        reopening = time.monotonic()
        await outage.reopen()
        up = time.monotonic()
        await grabs.wait_calls(grabs.calls + 100)
        await calls.stop()
        await grabs.stop()
        figures = await check_after_storm(
            f"SQL down ({type(outage).__name__})",
            grabs,
            app,
            client,
            down_s=round(reopening - down, 1),
            grabbed_while_down=grabbed_while_down,
            sql_calls=calls.outcomes(),
        )
        async with services_of(app).database.sessions() as session:
            members = {
                (user, order, team)
                for user, order, team in await session.execute(
                    select(MemberRow.user_id, MemberRow.order_id, MemberRow.team_id).where(
                        MemberRow.activity_id == ACTIVITY
                    )
                )
            }
            deposits = Counter(
                await session.scalars(
                    select(LedgerEntryRow.business_key).where(LedgerEntryRow.kind == "deposit")
                )
            )
            sent = set(
                await session.scalars(
                    select(PacketRow.packet_id).where(PacketRow.sender_id == "payer")
                )
            )

    assert not calls.unexpected, calls.unexpected[:5]
    answers = calls.answers
    # Every 503 is the outage's: answered after it began, asked before it ended.
    stray = [
        a for a in answers if a.outcome == SQL_DOWN and not (began <= a.answered and a.sent <= up)
    ]
    assert not stray, (
        f"outage from {began:.2f} to {up:.2f}",
        [(a.kind, a.ids, round(a.sent, 2), round(a.answered, 2)) for a in stray[:5]],
    )
    # Asked and answered while SQL was away: what needs SQL answered 503 database_unavailable.
    needs_sql = WRITES + (READS if outage.reads_fail else ())
    inside = [a for a in answers if down <= a.sent and a.answered <= reopening]
    wrong = [a for a in inside if a.kind in needs_sql and a.outcome != SQL_DOWN]
    assert not wrong, wrong[:5]
    inside_kinds = Counter(a.kind for a in inside if a.outcome == SQL_DOWN)
    assert all(inside_kinds[kind] for kind in needs_sql), inside_kinds
    # No confirm said yes before its membership was in SQL.
    told = [a for a in answers if a.kind == "confirm" and a.outcome == "2xx"]
    early = [
        a for a in told if a.answered <= reopening and (a.ids[1], a.ids[2]) not in members_at_end
    ]
    assert not early, early[:5]
    # The confirms answered 503 were retried afterwards and are members now (the script had
    # made them members: the retry answers 200 with the first answer's team).
    retried = [a for a in told if a.retry]
    assert retried and all(a.status == 200 for a in retried), retried[:5]
    leaders = {(f"lead{i}", None, f"c{i}") for i in range(calls.teams)}
    confirmed = {(user, order, team) for user, (team, order, _) in calls.confirmed.items()}
    assert members == leaders | confirmed, sorted(members ^ (leaders | confirmed))[:5]
    # Every deposit and send answered 2xx is recorded once, and nothing else.
    assert deposits == Counter(
        [deposit_key("storm-funds"), *(deposit_key(ref) for ref in calls.deposited)]
    ), deposits
    assert sent == calls.sent_packets
    assert grabbed_while_down >= 20, grabbed_while_down  # grabs went on from Redis
    assert figures.lost == 0 and figures.duplicated == 0
    after = [a.answered - a.sent for a in answers if a.kind in WRITES and a.sent > up]
    print(
        f"[fault SQL down] {type(outage).__name__}: SQL away {reopening - down:.1f} s "
        f"(reopened in {up - reopening:.1f} s); inside it {dict(inside_kinds)} x 503; "
        f"{len(told)} confirms told 2xx ({len(retried)} on a retry after the outage), "
        f"{len(members_at_end)} members in SQL at its end; {grabbed_while_down} grabbed "
        f"meanwhile; slowest write after it {max(after, default=0):.2f} s"
    )
