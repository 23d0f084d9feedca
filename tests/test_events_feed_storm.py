"""The events feed under concurrent writers (SPEC §3, Events feed): a pager following
`GET /v1/events?after=` with small pages, while `groupbuy serve --workers 2` takes a grab
storm on packets, a seat storm on teams and their expiries (locks swept, teams failed,
packets refunded, by the scheduler and by job runs through both workers), sees every event
of the final table once, in order. On PostgreSQL, where concurrent transactions commit out
of id order, and on SQLite."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import select

from groupbuy import migrations
from groupbuy.storage.db import Database
from groupbuy.storage.events import EventRow
from tests.support.database import throwaway_postgres
from tests.support.feed import DATABASES, database_url
from tests.support.http import ADMIN, SERVICE
from tests.support.postgres import PostgresProcess
from tests.support.service import service_environment, start_service

pytestmark = pytest.mark.slow

# How long the writers run; the expiries they set off finish within a few seconds after.
STORM_S = 14.0
# The feed's page size for the pager: small, so it reads often and sits at the head.
PAGE = 5
# Concurrent clients of each kind. Senders write their packet.sent event in the send's own
# transaction, many at once: the transactions most apt to commit out of id order.
SENDERS = 4
GRABBERS = 6
SHOPPERS = 6
# Readers following the feed at once, each on its own: more chances to stand at the head
# of the feed when a transaction commits late.
PAGERS = 5
# Every kind of event the storm must have produced for the test to mean something.
EXPECTED_TYPES = {
    "packet.sent",
    "packet.sold_out",
    "packet.refunded",
    "team.opened",
    "team.member_joined",
    "team.formed",
    "team.failed",
    "lock.expired",
}
JOBS = ("sweep_locks", "expire_teams", "expire_packets", "flush_records")


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresProcess]:
    yield from throwaway_postgres()


@dataclass
class Storm:
    """What the storm's tasks share: the service, what exists, what the pager saw."""

    client: httpx.AsyncClient
    stop_at: float
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    packets: list[str] = field(default_factory=list)
    activities: list[str] = field(default_factory=list)
    answers: Counter[tuple[str, int]] = field(default_factory=Counter)

    def running(self) -> bool:
        return time.monotonic() < self.stop_at

    def name(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids)}"

    async def call(
        self, what: str, method: str, path: str, body: Any = None, admin: bool = False
    ) -> httpx.Response:
        response = await self.client.request(
            method, path, json=body, headers=ADMIN if admin else SERVICE
        )
        self.answers[(what, response.status_code)] += 1
        return response


async def _sender(storm: Storm, sender: str) -> None:
    await storm.call(
        "deposit",
        "POST",
        f"/v1/accounts/{sender}/deposits",
        {"amount_cents": 10**9, "reference": f"fund-{sender}"},
        admin=True,
    )
    while storm.running():
        packet_id = storm.name("p")
        # Two shares: the grabbers sell many out; the rest expire and are refunded.
        body = {"sender_id": sender, "packet_id": packet_id, "amount_cents": 200, "count": 2}
        response = await storm.call("send", "POST", "/v1/redpackets", {**body, "expires_in_s": 2})
        if response.status_code == 201:
            storm.packets.append(packet_id)


async def _grabber(storm: Storm, rng: random.Random) -> None:
    while storm.running():
        if not storm.packets:
            await asyncio.sleep(0.01)
            continue
        packet_id = rng.choice(storm.packets[-4:])
        user = storm.name("g")
        await storm.call("grab", "POST", f"/v1/redpackets/{packet_id}/grab", {"user_id": user})


async def _organiser(storm: Storm) -> None:
    while storm.running():
        activity_id = storm.name("a")
        await storm.call(
            "activity",
            "POST",
            "/v1/activities",
            {"activity_id": activity_id, "team_size": 3, "lock_ttl_s": 1, "team_deadline_s": 3},
            admin=True,
        )
        storm.activities.append(activity_id)
        for _ in range(3):
            leader = storm.name("L")
            await storm.call(
                "open", "POST", f"/v1/activities/{activity_id}/teams", {"leader_id": leader}
            )
        await asyncio.sleep(0.3)


async def _shopper(storm: Storm, rng: random.Random) -> None:
    while storm.running():
        if not storm.activities:
            await asyncio.sleep(0.01)
            continue
        activity_id = rng.choice(storm.activities[-3:])
        user = storm.name("u")
        locked = await storm.call(
            "join", "POST", f"/v1/activities/{activity_id}/locks", {"user_id": user}
        )
        # Half pay (member joined, some teams form); the other half let the lock expire.
        if locked.status_code == 201 and rng.random() < 0.5:
            team_id = locked.json()["team_id"]
            await storm.call(
                "confirm",
                "POST",
                f"/v1/activities/{activity_id}/teams/{team_id}/members",
                {"user_id": user, "order_id": f"o-{user}"},
            )


async def _operator(storm: Storm) -> None:
    """Runs the expiry jobs through the HTTP API as well, so both workers run them at once."""
    while storm.running():
        await asyncio.gather(
            *(storm.call(job, "POST", f"/v1/admin/jobs/{job}/run", admin=True) for job in JOBS)
        )
        await asyncio.sleep(0.2)


@dataclass
class Pager:
    """A reader of the feed: its cursor and every event it was served, in order."""

    cursor: int = 0
    seen: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)

    async def page(self, storm: Storm) -> int:
        """Read the next page; how many events it held."""
        path = f"/v1/events?after={self.cursor}&limit={PAGE}"
        response = await storm.call("events", "GET", path)
        assert response.status_code == 200, response.text
        page = response.json()
        self.seen.extend((e["id"], e["type"], e["data"]) for e in page["events"])
        self.cursor = page["next_after"]
        return len(page["events"])

    async def follow(self, storm: Storm) -> None:
        """Page continuously while the writers run, as a backend polling the feed does."""
        while storm.running():
            if not await self.page(storm):
                await asyncio.sleep(0.005)


async def _settle(storm: Storm, pagers: list[Pager]) -> None:
    """After the writers: let every lock, team and packet expire, run the jobs until the
    write-behind is drained, then page to the end."""
    await asyncio.sleep(3.5)  # past the last team deadlines (3 s) and packet lifetimes (2 s)
    for _ in range(3):
        for job in JOBS:
            response = await storm.call(job, "POST", f"/v1/admin/jobs/{job}/run", admin=True)
            assert response.status_code == 200, response.text
        await asyncio.sleep(0.5)
    for pager in pagers:
        while await pager.page(storm):
            pass


async def _run_storm(url: str, seconds: float) -> tuple[Storm, list[Pager]]:
    limits = httpx.Limits(max_connections=40, max_keepalive_connections=40)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        storm = Storm(client, time.monotonic() + seconds)
        rng = random.Random(10)
        pagers = [Pager() for _ in range(PAGERS)]
        await asyncio.gather(
            *(_sender(storm, f"s{n}") for n in range(SENDERS)),
            _organiser(storm),
            _operator(storm),
            *(pager.follow(storm) for pager in pagers),
            *(_grabber(storm, random.Random(rng.random())) for _ in range(GRABBERS)),
            *(_shopper(storm, random.Random(rng.random())) for _ in range(SHOPPERS)),
        )
        await _settle(storm, pagers)
        return storm, pagers


async def _create_tables(url: str) -> None:
    database = Database(url)
    try:
        await migrations.upgrade(database)
    finally:
        await database.dispose()


async def _table(url: str) -> tuple[list[tuple[int, str, dict[str, Any]]], int]:
    """Every positioned event in feed order, and how many rows have no position."""
    database = Database(url)
    try:
        async with database.sessions() as session:
            rows = (
                await session.execute(
                    select(EventRow.position, EventRow.type, EventRow.data).order_by(
                        EventRow.position
                    )
                )
            ).all()
    finally:
        await database.dispose()
    positioned = [(p, t, json.loads(d)) for p, t, d in rows if p is not None]
    return positioned, len(rows) - len(positioned)


@pytest.mark.real
@pytest.mark.parametrize("kind", DATABASES)
def test_a_pager_sees_every_event_once_in_order_under_a_storm(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, real_redis_url: str
) -> None:
    with redis.Redis.from_url(real_redis_url) as sync_client:
        sync_client.flushall()
    url = database_url(kind, tmp_path, request)
    # The schema first: the storm is about the feed, not about two workers creating tables.
    asyncio.run(_create_tables(url))
    env = service_environment(
        tmp_path,
        GROUPBUY_REDIS_URL=real_redis_url,
        GROUPBUY_DATABASE_URL=url,
        GROUPBUY_RATELIMIT_ENABLED="false",
        GROUPBUY_SCHEDULER_SWEEP_INTERVAL_S="0.2",
        GROUPBUY_SCHEDULER_EXPIRE_PACKETS_INTERVAL_S="0.2",
        GROUPBUY_SCHEDULER_LEASE_TTL_S="1",
        GROUPBUY_OUTBOX_FLUSH_INTERVAL_S="0.2",
    )
    service = start_service(tmp_path, "--workers", "2", env=env)
    try:
        storm, pagers = asyncio.run(_run_storm(service.url, STORM_S))
    finally:
        assert service.stop() == 0, service.text()
    table, unpositioned = asyncio.run(_table(url))

    failures = {key: n for key, n in storm.answers.items() if key[1] >= 500}
    assert not failures, (failures, service.text()[-3000:])
    assert {t for _, t, _ in table} >= EXPECTED_TYPES, Counter(t for _, t, _ in table)
    table_ids = [event_id for event_id, _, _ in table]
    print(f"{kind}: {len(table)} events", dict(Counter(t for _, t, _ in table)))
    assert unpositioned == 0
    problems = []
    for number, pager in enumerate(pagers, 1):
        seen_ids = [event_id for event_id, _, _ in pager.seen]
        missed = sorted(set(table_ids) - set(seen_ids))
        twice = [event_id for event_id, n in Counter(seen_ids).items() if n > 1]
        summary = (
            f"{kind}: {len(table)} events in the table, pager {number} saw {len(seen_ids)}, "
            f"missed {len(missed)} {missed[:20]}, saw {len(twice)} twice"
        )
        print(summary)
        if missed or twice or pager.seen != table:
            problems.append(summary)
    assert not problems, problems
