"""Several replicas (SPEC §5, production): three `groupbuy serve` processes, each with its
own scheduler, on one redis-server and one database (PostgreSQL, and a SQLite file).

Seat joins, confirms, unlocks, sends and grabs go through the replicas at once,
round-robin. Locks expire, teams reach their deadline (failed, or formed by virtual
completion), packets sell out or expire with a refund, all within seconds (short TTLs
and job intervals). At KILL_AT_S the replica that holds the scheduler lease is killed
with SIGKILL and a replacement started; at STOP_AT_S the one that took the lease over is
stopped with SIGTERM; a third runs the jobs to the end. Calls cut off on the way are sent
again to another replica. Then every guarantee of SPEC §4 that concerns state is checked
against the answers clients were given, the events feed and the SQL tables: each lock
expiry, team ending and refund recorded exactly once, and running every job again in
every replica changes nothing. docs/reliability.md ("Several replicas") has the figures.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from groupbuy_client.wire import to_ms
from sqlalchemy import func, select

from groupbuy.locks.models import MemberRow, TeamRow
from groupbuy.redpacket.codec import grab_credit_key, refund_key
from groupbuy.redpacket.models import AccountRow, GrabRow, LedgerEntryRow, PacketRow
from groupbuy.services import Services, build_services
from groupbuy.settings import load_settings
from groupbuy.storage.db import Database
from groupbuy.storage.events import EventRow
from tests.support.database import start_postgres_or_skip
from tests.support.http import ADMIN, ms
from tests.support.money import assert_money_conserved
from tests.support.redis import make_async_redis
from tests.support.replicas import (
    Replica,
    ReplicaSet,
    replica_environment,
    start_replicas,
    stop_replicas,
)
from tests.support.seats import check_seat_snapshot, seat_snapshot
from tests.support.servers import RedisProcess, start_redis
from tests.support.service import run_groupbuy
from tests.support.settings import API_KEYS
from tests.support.starting import NO_REDIS, started_or_skip

pytestmark = [pytest.mark.real, pytest.mark.slow]

REPLICAS = 3
TEAMS = 30  # per activity
TEAM_SIZE = 3
LOCK_TTL_S = 2
TEAM_DEADLINE_S = 10
PACKET_EXPIRES_S = 9
STORM_S = 6.0
KILL_AT_S = 2.0  # into the storm
STOP_AT_S = 4.0  # into the storm
CALLERS = 16
LEASE_TTL_S = 1.0
JOB_INTERVAL_S = 0.2
# Grab records a killed writer had read and not acknowledged are taken over after this.
RECLAIM_IDLE_S = 2.0
# Packets: (id, amount, shares); the small ones sell out, the big ones expire with a rest.
PACKETS = [(f"big{i}", 100_000, 1000) for i in range(4)] + [(f"hot{i}", 300, 10) for i in range(2)]
# Packets sent during the storm (by another sender): small, short-lived.
SENT_AMOUNT, SENT_SHARES, SENT_EXPIRES_S = 60, 6, 3
ACTIVITIES = {
    "act": {},  # a team short of members at its deadline fails
    "virt": {"virtual_completion": {"min_members": 2}},  # formed with 2 of 3 at the deadline
}
JOBS = ("sweep_locks", "expire_teams", "expire_packets", "flush_records", "repair", "reconcile")


async def prepare_database(directory: Path, environment: dict[str, str]) -> None:
    """Give the replicas' database its schema before any of them starts, as a deployment
    does before it starts several processes (which must not race to create it)."""
    done = await asyncio.to_thread(run_groupbuy, directory, environment, "db", "upgrade")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of the replicas' database: a SQLite file, or a database of a throwaway
    PostgreSQL cluster."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}"
        return
    server = start_postgres_or_skip()
    try:
        yield server.create_database("replicas")
    finally:
        server.stop()


@pytest.fixture
def shared_redis() -> Iterator[RedisProcess]:
    """The replicas' redis-server, with the persistence production needs."""
    server = started_or_skip(
        lambda: start_redis("--appendonly", "yes", "--appendfsync", "always"), NO_REDIS
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def replicas(
    tmp_path: Path, shared_redis: RedisProcess, shared_database: str
) -> AsyncIterator[ReplicaSet]:
    """Three replicas ready on the shared Redis and database, stopped with SIGTERM at the
    end (each must exit 0)."""
    environment = replica_environment(
        tmp_path,
        shared_redis.url,
        shared_database,
        GROUPBUY_SCHEDULER_LEASE_TTL_S=str(LEASE_TTL_S),
        GROUPBUY_SCHEDULER_SWEEP_INTERVAL_S=str(JOB_INTERVAL_S),
        GROUPBUY_SCHEDULER_EXPIRE_PACKETS_INTERVAL_S=str(JOB_INTERVAL_S),
        GROUPBUY_SCHEDULER_REPAIR_INTERVAL_S="1",
        GROUPBUY_SCHEDULER_RECONCILE_INTERVAL_S="3",
        GROUPBUY_OUTBOX_FLUSH_INTERVAL_S="0.1",
        GROUPBUY_REDPACKETS_RECLAIM_IDLE_S=str(RECLAIM_IDLE_S),
        GROUPBUY_REDIS_SOCKET_TIMEOUT_S="2",
    )
    await prepare_database(tmp_path, environment)
    started = await start_replicas(tmp_path, REPLICAS, environment)
    try:
        yield started
    finally:
        await started.aclose()
        failed = stop_replicas(started)
        assert not failed, failed


@pytest.fixture
async def observer(shared_redis: RedisProcess, shared_database: str) -> AsyncIterator[Services]:
    """Services in the test's own process (no scheduler, no HTTP), to read Redis and SQL."""
    settings = load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_REDIS_URL": shared_redis.url,
            "GROUPBUY_DATABASE_URL": shared_database,
        },
    )
    client = make_async_redis(shared_redis.url)
    database = Database(shared_database)
    try:
        yield build_services(settings, redis=client, database=database)
    finally:
        await database.dispose()
        await client.aclose()


@dataclass
class Seat:
    """A seat lock a client was told it holds, and what became of it."""

    activity_id: str
    team_id: str
    user_id: str
    locked_at_ms: int
    expires_at_ms: int
    # member | unlocked | expired (let go, or told lock_required, or released: false)
    # | unknown (an unlock cut off on its way: released by it or expired, either)
    fate: str = "held"


@dataclass
class Traffic:
    """Joins, confirms, unlocks and grabs by concurrent callers, through every replica."""

    replicas: ReplicaSet
    seed: int = 10
    seats: list[Seat] = field(default_factory=list)
    members: set[tuple[str, str, str]] = field(default_factory=set)  # (activity, team, user)
    orders: dict[tuple[str, str], str] = field(default_factory=dict)  # (activity, user) -> order
    grabs: dict[tuple[str, str], int] = field(default_factory=dict)  # told grabbed: amount
    uncertain_joins: set[tuple[str, str]] = field(default_factory=set)
    answers: Counter[str] = field(default_factory=Counter)
    odd: list[str] = field(default_factory=list)  # answers no client should ever get
    calls: int = 0
    deadlines: dict[tuple[str, str], int] = field(default_factory=dict)  # team -> ms
    expiries: dict[str, int] = field(default_factory=dict)  # packet -> ms
    sent: dict[str, tuple[int, int]] = field(default_factory=dict)  # packet -> amount, shares
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: Iterator[int] = field(default_factory=lambda: iter(range(10**9)))

    async def prepare(self) -> None:
        """Activities and their teams, the sender's funds and the packets."""
        calls = self.replicas
        total = sum(amount for _, amount, _ in PACKETS)
        deposit = {"amount_cents": total + 1000, "reference": "replicas-funds"}
        await calls.must("POST", "/v1/accounts/sender/deposits", deposit, 201, ADMIN)
        deposit = {"amount_cents": 1_000_000, "reference": "replicas-funds-2"}
        await calls.must("POST", "/v1/accounts/sender2/deposits", deposit, 201, ADMIN)
        for activity_id, extra in ACTIVITIES.items():
            body = {
                "activity_id": activity_id,
                "team_size": TEAM_SIZE,
                "lock_ttl_s": LOCK_TTL_S,
                "team_deadline_s": TEAM_DEADLINE_S,
                **extra,
            }
            await calls.must("POST", "/v1/activities", body, 201, ADMIN)
        opens = [
            calls.must(
                "POST",
                f"/v1/activities/{activity_id}/teams",
                {"leader_id": f"L-{activity_id}-{i}", "team_id": f"t{i}", "order_id": f"lo{i}"},
                201,
            )
            for activity_id in ACTIVITIES
            for i in range(TEAMS)
        ]
        sends = [
            calls.must(
                "POST",
                "/v1/redpackets",
                {
                    "sender_id": "sender",
                    "amount_cents": amount,
                    "count": shares,
                    "packet_id": packet_id,
                    "expires_in_s": PACKET_EXPIRES_S,
                },
                201,
            )
            for packet_id, amount, shares in PACKETS
        ]
        for team in await asyncio.gather(*opens):
            self.deadlines[team["activity_id"], team["team_id"]] = ms(team["deadline_at"])
        for packet in await asyncio.gather(*sends):
            self.expiries[packet["packet_id"]] = ms(packet["expires_at"])
        self.sent = {packet_id: (amount, shares) for packet_id, amount, shares in PACKETS}

    def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self._caller(i)) for i in range(CALLERS)]

    def stop(self) -> None:
        self._stop.set()

    async def _caller(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        while not self._stop.is_set():
            roll = rng.random()
            if roll < 0.4:
                await self._join(rng, rng.choice(list(ACTIVITIES)), f"u{next(self._ids)}")
            elif roll < 0.45:
                await self._send(f"s{next(self._ids)}")
            elif roll < 0.9 or not self.grabs:
                packet_id = rng.choice(sorted(self.sent))
                await self._grab(packet_id, f"g{next(self._ids)}")
            else:  # the same grab again: through another replica, it must say the same
                packet_id, user_id = rng.choice(sorted(self.grabs))
                await self._grab(packet_id, user_id)
            await asyncio.sleep(rng.uniform(0, 0.02))

    async def at_the_ends(self, activity_id: str, packet_ids: list[str]) -> None:
        """Calls while time ends things: grabs of these packets from just before their
        expiry to just after, then seat locks of every team of the activity around its
        deadline, so that the lazy checks in the scripts race the schedulers' jobs."""
        ids = self._ids

        async def until(moment_ms: int, call: Any) -> None:
            while time.time() * 1000 < moment_ms + 700:
                await call()

        async def grab_late() -> None:
            await self._grab(random.choice(packet_ids), f"late{next(ids)}", late=True)

        async def lock_late(team_id: str) -> None:
            await self._join(None, activity_id, f"late{next(ids)}", team_id)

        expiry = max(self.expiries[p] for p in packet_ids)
        await asyncio.sleep(max(0, expiry - 500 - time.time() * 1000) / 1000)
        await asyncio.gather(*(until(expiry, grab_late) for _ in range(4)))
        deadline = max(ms for (a, _t), ms in self.deadlines.items() if a == activity_id)
        await asyncio.sleep(max(0, deadline - 500 - time.time() * 1000) / 1000)
        await asyncio.gather(
            *(
                until(deadline, lambda team_id=team_id: lock_late(team_id))
                for (a, team_id) in self.deadlines
                if a == activity_id
            )
        )

    async def _join(
        self,
        rng: random.Random | None,
        activity_id: str,
        user_id: str,
        team_id: str | None = None,
    ) -> None:
        """A lock of any team of the activity (or of the team named), then what the
        shopper does with it (`rng` None: nothing, the lock is left to run out)."""
        self.calls += 1
        if team_id is None:
            answer = await self.replicas.call(
                "POST", f"/v1/activities/{activity_id}/locks", {"user_id": user_id}
            )
        else:
            answer = await self.replicas.call(
                "POST", f"/v1/activities/{activity_id}/teams/{team_id}/locks", {"user_id": user_id}
            )
            if answer.status == 409 and answer.body.get("code") in (
                "team_failed",
                "team_formed",
                "team_full",
            ):
                self.answers[f"lock {answer.body['code']}"] += 1
                return
        if answer.uncertain:
            self.uncertain_joins.add((activity_id, user_id))
        if answer.status == 409 and answer.body.get("code") == "no_team_available":
            self.answers["join no_team_available"] += 1
            return
        if answer.status not in (200, 201) or (answer.status == 200 and not answer.uncertain):
            # a first answer "existing" with no earlier attempt cut off would be a lock
            # this user never asked for
            self.odd.append(f"join {activity_id} {user_id}: {answer}")
            return
        self.answers["join locked"] += 1
        body = answer.body
        seat = Seat(
            activity_id,
            body["team_id"],
            user_id,
            ms(body["locked_at"]),
            ms(body["expires_at"]),
        )
        self.seats.append(seat)
        if rng is None:
            seat.fate = "expired"
            return
        fate = rng.random()
        if fate < 0.5:  # pays within the lock's time (mostly): becomes a member
            await asyncio.sleep(rng.uniform(0, LOCK_TTL_S * 0.8))
            await self._confirm(seat)
        elif fate < 0.58:  # pays too late: told lock_required (and refunded by the backend)
            await asyncio.sleep(LOCK_TTL_S + 0.3)
            await self._confirm(seat)
        elif fate < 0.73:  # gives up on the payment page
            await asyncio.sleep(rng.uniform(0, LOCK_TTL_S * 0.5))
            await self._unlock(seat)
        else:
            seat.fate = "expired"  # walks away: the lock must expire by itself

    async def _confirm(self, seat: Seat) -> None:
        self.calls += 1
        order_id = f"o-{seat.user_id}"
        path = f"/v1/activities/{seat.activity_id}/teams/{seat.team_id}/members"
        answer = await self.replicas.call(
            "POST", path, {"user_id": seat.user_id, "order_id": order_id}
        )
        if answer.status in (200, 201):
            self.answers["confirm member"] += 1
            seat.fate = "member"
            self.members.add((seat.activity_id, seat.team_id, seat.user_id))
            self.orders[seat.activity_id, seat.user_id] = order_id
            user_ids = [m["user_id"] for m in answer.body["team"]["members"]]
            if seat.user_id not in user_ids or (answer.status == 200 and not answer.uncertain):
                self.odd.append(f"confirm {seat}: {answer}")
        elif answer.status == 409 and answer.body.get("code") == "lock_required":
            self.answers["confirm lock_required"] += 1
            seat.fate = "expired"  # paid too late: the lock had expired
        elif (
            answer.status == 409
            and answer.body.get("code") in ("team_formed", "team_failed")
            and time.time() * 1000
            >= min(seat.expires_at_ms, self.deadlines[seat.activity_id, seat.team_id])
        ):
            # paid after the lock or the team's time was up: others took the seat and
            # completed the team, or the team failed at its deadline
            self.answers[f"confirm {answer.body['code']}"] += 1
            seat.fate = "expired"
        else:
            self.odd.append(f"confirm {seat}: {answer}")

    async def _unlock(self, seat: Seat) -> None:
        self.calls += 1
        path = f"/v1/activities/{seat.activity_id}/teams/{seat.team_id}/locks/{seat.user_id}"
        answer = await self.replicas.call("DELETE", path)
        if answer.status != 200:
            self.odd.append(f"unlock {seat}: {answer}")
            return
        self.answers[f"unlock released {answer.body['released']}"] += 1
        if answer.body["released"]:
            seat.fate = "unlocked"
        else:
            # expired before the unlock arrived, or released by an attempt cut off
            seat.fate = "unknown" if answer.uncertain else "expired"

    async def _send(self, packet_id: str) -> None:
        self.calls += 1
        body = {
            "sender_id": "sender2",
            "amount_cents": SENT_AMOUNT,
            "count": SENT_SHARES,
            "packet_id": packet_id,
            "expires_in_s": SENT_EXPIRES_S,
        }
        answer = await self.replicas.call("POST", "/v1/redpackets", body)
        if answer.status == 201 or (answer.status == 200 and answer.uncertain):
            self.answers["send sent"] += 1
            self.expiries[packet_id] = ms(answer.body["expires_at"])
            self.sent[packet_id] = (SENT_AMOUNT, SENT_SHARES)
        else:
            self.odd.append(f"send {packet_id}: {answer}")

    async def _grab(self, packet_id: str, user_id: str, late: bool = False) -> None:
        self.calls += 1
        answer = await self.replicas.call(
            "POST", f"/v1/redpackets/{packet_id}/grab", {"user_id": user_id}
        )
        key = (packet_id, user_id)
        body = answer.body
        if answer.status >= 400 and f"'{packet_id}'" not in str(body.get("detail")):
            self.odd.append(f"grab {key}: an answer about another packet {answer}")
        if answer.status == 200 and body["status"] in ("grabbed", "already_grabbed"):
            self.answers[f"grab {body['status']}"] += 1
            first = key not in self.grabs
            if first and body["status"] == "already_grabbed" and not answer.uncertain:
                self.odd.append(f"grab {key}: already_grabbed on a first try")
            told = self.grabs.setdefault(key, int(body["amount_cents"]))
            if told != body["amount_cents"]:
                self.odd.append(f"grab {key}: {body} after {told}")
        elif key in self.grabs:  # a repeat answers already_grabbed, ended packet or not
            self.odd.append(f"grab {key}: {answer} after grabbed")
        elif answer.status == 409 and body.get("code") == "sold_out":
            self.answers["grab sold_out"] += 1
        elif (
            answer.status == 410
            and body.get("code") == "expired"
            and (late or time.time() * 1000 >= self.expiries[packet_id])
        ):
            self.answers["grab expired"] += 1
        else:
            self.odd.append(f"grab {key}: {answer}")


async def watch_seats(observer: Services, stop: asyncio.Event, until_ms: int) -> int:
    """SPEC §4 (1, 2) at instants read from Redis in one MULTI/EXEC each, until `stop` or
    shortly before `until_ms` (the first deadline: after it a team may end short of
    members); returns how many instants were checked."""
    checked = 0
    teams = [f"t{i}" for i in range(TEAMS)]
    while not stop.is_set() and time.time() * 1000 < until_ms - 300:
        for activity_id in ACTIVITIES:
            now_ms, replies = await seat_snapshot(observer.redis, observer, activity_id, teams)
            # a formed team's keys leave Redis once it is recorded (the repair job)
            held = [i for i, tid in enumerate(teams) if replies[2 * i + 1][2] is not None]
            kept = [reply for i in held for reply in replies[2 * i : 2 * i + 2]]
            check_seat_snapshot(now_ms, kept, [teams[i] for i in held])
            checked += 1
        await asyncio.sleep(0.05)
    return checked


async def lease_holder(replicas: ReplicaSet, timeout_s: float = 15) -> Replica:
    """The one live replica that says it holds the scheduler lease, once one alone does.

    None does for up to a lease's time after its holder died; two may for a moment when
    a holder stalled past its lease's time and has not yet renewed it and learned that
    another took it (the jobs are idempotent for that). Either settles by itself."""
    deadline = time.monotonic() + timeout_s
    while True:
        holding = [replica for replica in replicas.live() if await replica.holds_lease()]
        if len(holding) == 1:
            return holding[0]
        assert time.monotonic() < deadline, f"lease holders: {[r.name for r in holding]}"
        await asyncio.sleep(0.1)


async def wait_until_everything_ended(observer: Services, timeout_s: float = 60) -> None:
    """Until SQL has every team and packet ended and no record waits in Redis: what the
    schedulers do once the clients have stopped."""
    keys = observer.keys
    deadline = time.monotonic() + timeout_s
    while True:
        async with observer.database.sessions() as session:
            open_teams = await session.scalar(
                select(func.count()).select_from(TeamRow).where(TeamRow.status == "open")
            )
            live_packets = await session.scalar(
                select(func.count())
                .select_from(PacketRow)
                .where(PacketRow.status.not_in(("sold_out", "expired")))
            )
        waiting = await observer.redis.zcard(
            keys.pending_activities()
        ) + await observer.redis.zcard(keys.pending_packets())
        if open_teams == 0 and live_packets == 0 and waiting == 0:
            return
        assert time.monotonic() < deadline, (
            f"after {timeout_s} s: {open_teams} teams open, {live_packets} packets live, "
            f"{waiting} outbox streams waiting"
        )
        await asyncio.sleep(0.2)


async def read_feed(replicas: ReplicaSet) -> list[dict[str, Any]]:
    """The whole events feed, page by page, each page from the next replica."""
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await replicas.must("GET", f"/v1/events?after={after}&limit=100", None, 200)
        events += page["events"]
        if not page["events"]:
            return events
        after = page["next_after"]


async def business_state(observer: Services) -> dict[str, Any]:
    """What the jobs must never change twice: every event, ledger entry, balance, grab,
    member, and the status of every team and packet."""
    async with observer.database.sessions() as session:

        async def rows(*columns: Any) -> list[tuple[Any, ...]]:
            result = await session.execute(select(*columns).order_by(*columns))
            return [tuple(row) for row in result]

        return {
            "events": await rows(EventRow.id, EventRow.dedup_key),
            "ledger": await rows(LedgerEntryRow.business_key, LedgerEntryRow.amount_cents),
            "accounts": await rows(AccountRow.user_id, AccountRow.balance_cents),
            "grabs": await rows(GrabRow.packet_id, GrabRow.user_id, GrabRow.amount_cents),
            "members": await rows(MemberRow.activity_id, MemberRow.team_id, MemberRow.user_id),
            "teams": await rows(TeamRow.activity_id, TeamRow.team_id, TeamRow.status),
            "packets": await rows(PacketRow.packet_id, PacketRow.status, PacketRow.refunded_cents),
        }


async def check_feed(feed: list[dict[str, Any]], observer: Services) -> None:
    """The feed, read through the replicas, is the events table in feed order, each once:
    every event has its place (position) and the feed lists them all."""
    async with observer.database.sessions() as session:
        result = await session.execute(
            select(EventRow.position, EventRow.type).order_by(EventRow.position, EventRow.id)
        )
        table = [tuple(row) for row in result]
    ids = [event["id"] for event in feed]
    assert ids == sorted(set(ids)), "the feed repeats or reorders events"
    assert [(event["id"], event["type"]) for event in feed] == table, (len(feed), len(table))


def check_teams(
    traffic: Traffic,
    by_type: dict[str, list[dict[str, Any]]],
    teams: dict[tuple[str, str], TeamRow],
    members: dict[tuple[str, str], list[MemberRow]],
) -> None:
    """SPEC §4.1 and §4.6 for teams: every member told so is one, and nobody else; a formed
    team is full (or virtually completed), a failed one below its threshold; one
    team.opened, team.formed or team.failed event each, listing the members to refund."""
    told = {(a, t): set[str]() for a, t in teams}
    for activity_id, team_id, user_id in traffic.members:
        told[activity_id, team_id].add(user_id)
    for key, team in teams.items():
        rows = members.get(key, [])
        users = [row.user_id for row in rows]
        assert len(users) == len(set(users)) <= TEAM_SIZE, (key, users)
        assert set(users) == told[key] | {team.leader_id}, (key, users, told[key])
        for row in rows:
            paid = traffic.orders.get((row.activity_id, row.user_id), f"lo{key[1][1:]}")
            assert row.order_id == paid, (key, row.user_id, row.order_id)
        assert sorted(row.seq for row in rows) == list(range(1, len(rows) + 1)), (key, rows)
        virtual_min = ACTIVITIES[key[0]].get("virtual_completion", {}).get("min_members")
        if len(rows) == TEAM_SIZE:
            assert team.status == "formed", (key, team.status)
        elif virtual_min is not None and len(rows) >= virtual_min:
            assert team.status == "formed", (key, team.status, len(rows))
        else:
            assert team.status == "failed", (key, team.status, len(rows))
    for kind in ("team.opened", "team.formed", "team.failed"):
        ended = Counter((e["data"]["activity_id"], e["data"]["team_id"]) for e in by_type[kind])
        expected = {
            key: 1
            for key, team in teams.items()
            if kind == "team.opened" or team.status == kind.removeprefix("team.")
        }
        assert dict(ended) == expected, (kind, dict(ended), expected)
    for event in by_type["team.formed"] + by_type["team.failed"]:
        data = event["data"]
        key = (data["activity_id"], data["team_id"])
        listed = {(m["user_id"], m["order_id"]) for m in data["members"]}
        recorded = {(row.user_id, row.order_id) for row in members[key]}
        assert listed == recorded, (event, recorded)
        if event["type"] == "team.formed":
            assert data["virtual_seats"] == TEAM_SIZE - len(recorded), event
    joined = Counter(
        (e["data"]["activity_id"], e["data"]["team_id"], e["data"]["user_id"])
        for e in by_type["team.member_joined"]
    )
    assert dict(joined) == dict.fromkeys(traffic.members, 1)


def check_lock_expiries(
    traffic: Traffic, lock_expired: list[dict[str, Any]], deadlines: dict[tuple[str, str], int]
) -> None:
    """SPEC §4.6 for locks: one lock.expired event for every lock that ran out before its
    team's deadline (let go, paid too late, or gone before its unlock), none for a lock
    that was paid or released, none twice."""
    seen = Counter(
        (
            e["data"]["activity_id"],
            e["data"]["team_id"],
            e["data"]["user_id"],
            ms(e["data"]["locked_at"]),
        )
        for e in lock_expired
    )
    twice = [key for key, n in seen.items() if n > 1]
    assert not twice, twice
    told = {(s.activity_id, s.team_id, s.user_id, s.locked_at_ms): s for s in traffic.seats}
    for key, seat in told.items():
        ran_out = seat.expires_at_ms <= deadlines[seat.activity_id, seat.team_id]
        if seat.fate == "expired" and ran_out:
            assert seen[key] == 1, ("no lock.expired", seat)
        elif seat.fate in ("member", "unlocked"):
            assert seen[key] == 0, ("lock.expired of a lock paid or released", seat)
        elif seat.fate == "expired":
            assert seen[key] == 0, ("lock.expired after the team had ended", seat)
    # a lock nobody was told of: only where a join was cut off and sent again
    unknown = [key for key in seen if key not in told]
    assert all((key[0], key[2]) in traffic.uncertain_joins for key in unknown), unknown


async def every_grab(
    replicas: ReplicaSet, packet_id: str, view: dict[str, Any]
) -> list[dict[str, Any]]:
    """A packet's grabs: the first page its GET carries, then the pages after it (a big
    packet grabbed more than a page's worth on a fast machine)."""
    listed, cursor = list(view["grabs"]), view.get("grabs_next_cursor")
    while cursor:
        path = f"/v1/redpackets/{packet_id}/grabs?cursor={cursor}&limit=100"
        page = await replicas.must("GET", path, None, 200)
        listed += page["grabs"]
        cursor = page.get("next_cursor") if page["grabs"] else None
    return listed


async def check_packets(
    replicas: ReplicaSet,
    traffic: Traffic,
    by_type: dict[str, list[dict[str, Any]]],
    observer: Services,
) -> None:
    """SPEC §4.3, §4.5 and §4.6 for packets: every grab told grabbed is one grab row and one
    ledger credit, nothing else is; a sold-out packet is fully grabbed, an expired one
    refunded its rest exactly once (one refund credit, one packet.refunded event)."""
    async with observer.database.sessions() as session:
        packets = {row.packet_id: row for row in await session.scalars(select(PacketRow))}
        grabs = list(await session.scalars(select(GrabRow)))
        ledger = list(
            await session.scalars(
                select(LedgerEntryRow).where(
                    LedgerEntryRow.kind.in_(("grab_credit", "refund_credit"))
                )
            )
        )
    rows = {(g.packet_id, g.user_id): g.amount_cents for g in grabs}
    assert rows == traffic.grabs, (
        sorted(set(rows.items()) ^ set(traffic.grabs.items()))[:10],
        len(rows),
        len(traffic.grabs),
    )
    credits = Counter(entry.business_key for entry in ledger)
    assert all(n == 1 for n in credits.values()), [k for k, n in credits.items() if n > 1]
    amounts = {entry.business_key: entry.amount_cents for entry in ledger}
    for (packet_id, user_id), amount in traffic.grabs.items():
        assert amounts.get(grab_credit_key(packet_id, user_id)) == amount, (packet_id, user_id)
    refunded = Counter(e["data"]["packet_id"] for e in by_type["packet.refunded"])
    sold_out = Counter(e["data"]["packet_id"] for e in by_type["packet.sold_out"])
    sent = Counter(e["data"]["packet_id"] for e in by_type["packet.sent"])
    assert dict(sent) == dict.fromkeys(packets, 1)
    assert set(packets) == set(traffic.sent), set(packets) ^ set(traffic.sent)
    for packet_id, (amount, shares) in traffic.sent.items():
        packet = packets[packet_id]
        amounts_grabbed = [a for (p, _u), a in rows.items() if p == packet_id]
        assert len(amounts_grabbed) <= shares and all(a >= 1 for a in amounts_grabbed)
        assert sum(amounts_grabbed) <= amount
        view = await replicas.must("GET", f"/v1/redpackets/{packet_id}", None, 200)
        assert view["status"] == packet.status, (view, packet.status)
        listed = await every_grab(replicas, packet_id, view)
        assert sorted(g["amount_cents"] for g in listed) == sorted(amounts_grabbed)
        if packet.status == "sold_out":
            assert len(amounts_grabbed) == shares and sum(amounts_grabbed) == amount
            assert (sold_out[packet_id], refunded[packet_id]) == (1, 0), packet_id
            assert refund_key(packet_id) not in amounts
        else:
            assert packet.status == "expired", packet.status
            rest = amount - sum(amounts_grabbed)
            assert packet.refunded_cents == rest == view["refunded_cents"] > 0, (packet_id, rest)
            assert (sold_out[packet_id], refunded[packet_id]) == (0, 1), packet_id
            assert amounts[refund_key(packet_id)] == rest
            (event,) = [
                e for e in by_type["packet.refunded"] if e["data"]["packet_id"] == packet_id
            ]
            assert event["data"]["refunded_cents"] == rest, event


EXPIRY_JOBS = ("sweep_locks", "expire_teams", "expire_packets", "flush_records")


async def wait_for_jobs(replica: Replica, timeout_s: float = 15) -> Counter[tuple[str, str]]:
    """Until the replica has run each expiry job at least once; its job runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        runs = await replica.job_runs()
        if all(runs[job, "ok"] for job in EXPIRY_JOBS):
            return runs
        assert time.monotonic() < deadline, (replica.name, runs)
        await asyncio.sleep(0.1)


@dataclass
class Storm:
    """What happened to the replicas during the storm."""

    killed: Replica  # the first lease holder, SIGKILLed
    stopped: Replica  # the second, stopped with SIGTERM
    stop_s: float  # how long its graceful stop took
    runs: dict[str, Counter[tuple[str, str]]]  # job runs of each, when it went
    replacement: Replica  # started after the kill
    instants: int  # instants of the seats checked


async def storm(replicas: ReplicaSet, traffic: Traffic, observer: Services) -> Storm:
    """The traffic for STORM_S, the seats watched meanwhile. At KILL_AT_S the replica that
    holds the scheduler lease is killed and a replacement started; at STOP_AT_S the replica
    that took the lease over is stopped gracefully."""
    watching = asyncio.Event()
    first_deadline = min(traffic.deadlines.values())
    watcher = asyncio.create_task(watch_seats(observer, watching, first_deadline))
    callers = traffic.start()
    began = time.monotonic()
    replacement: asyncio.Task[Replica] | None = None
    try:
        await asyncio.sleep(KILL_AT_S)
        killed = await lease_holder(replicas)
        runs = {killed.name: await wait_for_jobs(killed)}
        killed.kill()  # without a word: the lease runs out, SQL transactions are cut
        replacement = asyncio.create_task(replicas.add())
        stopped = await lease_holder(replicas)
        runs[stopped.name] = await wait_for_jobs(stopped)
        await asyncio.sleep(max(0, STOP_AT_S - (time.monotonic() - began)))
        # mid-traffic: it ends the calls it has and releases the lease, the others go on
        stopping = time.monotonic()
        code = await asyncio.to_thread(stopped.stop)
        stop_s = time.monotonic() - stopping
        assert code == 0 and "Traceback" not in stopped.service.text(), stopped.service.text()
        await asyncio.sleep(max(0, STORM_S - (time.monotonic() - began)))
        traffic.stop()
        watching.set()
        instants = await watcher
        await asyncio.gather(*callers)
        return Storm(killed, stopped, stop_s, runs, await replacement, instants)
    finally:
        traffic.stop()
        watching.set()
        for task in (watcher, *callers):
            task.cancel()
        await asyncio.gather(watcher, *callers, return_exceptions=True)
        if replacement is not None:  # a process being started is waited for, not left
            await asyncio.gather(replacement, return_exceptions=True)


async def test_three_replicas_keep_every_guarantee(
    replicas: ReplicaSet, observer: Services, capsys: pytest.CaptureFixture[str]
) -> None:
    traffic = Traffic(replicas)
    began = time.monotonic()
    await traffic.prepare()
    prepare_s = time.monotonic() - began
    happened = await storm(replicas, traffic, observer)
    third = await lease_holder(replicas)
    # "act" and big0, big1 end under calls; "virt" and the other packets by the jobs alone
    await traffic.at_the_ends("act", ["big0", "big1"])
    storm_s = time.monotonic() - began

    await wait_until_everything_ended(observer)
    ended_s = time.monotonic() - began

    # Three lease holders in turn ran the jobs, and no job failed anywhere.
    happened.runs[third.name] = await wait_for_jobs(third)
    holders = list(happened.runs)
    assert len(holders) == 3, happened.runs
    for replica in replicas.live():
        happened.runs[replica.name] = await replica.job_runs()
    for name, runs in happened.runs.items():
        assert not any(n for (_job, result), n in runs.items() if result == "error"), (name, runs)

    before = await business_state(observer)
    feed = await read_feed(replicas)
    await check_feed(feed, observer)
    by_type: dict[str, list[dict[str, Any]]] = {
        kind: []
        for kind in (
            "team.opened",
            "team.member_joined",
            "team.formed",
            "team.failed",
            "lock.expired",
            "packet.sent",
            "packet.sold_out",
            "packet.refunded",
        )
    }
    for event in feed:
        by_type[event["type"]].append(event)
    async with observer.database.sessions() as session:
        teams = {(t.activity_id, t.team_id): t for t in await session.scalars(select(TeamRow))}
        members: dict[tuple[str, str], list[MemberRow]] = {}
        for row in await session.scalars(select(MemberRow)):
            members.setdefault((row.activity_id, row.team_id), []).append(row)
    deadlines = {key: to_ms(team.deadline_at) for key, team in teams.items()}
    check_teams(traffic, by_type, teams, members)
    check_lock_expiries(traffic, by_type["lock.expired"], deadlines)
    await check_packets(replicas, traffic, by_type, observer)
    await assert_money_conserved(observer)
    assert not traffic.odd, traffic.odd[:10]
    assert not replicas.errors, replicas.errors[:10]

    # Running every job again, in every replica, changes nothing.
    for replica in replicas.live():
        for job in JOBS:
            await replicas.run_job(replica, job)
    assert await business_state(observer) == before
    # SPEC §4.9: everything ended and swept, Redis holds nothing that would stay forever
    # (the lease and the rate-limit buckets run out by themselves) but configuration: the
    # key of the audit log's fingerprints, made once when [auth] sets none.
    kept = [key async for key in observer.redis.scan_iter(count=1000)]
    configuration = {observer.keys.fingerprint_secret()}
    forever = [
        key for key in kept if key not in configuration and await observer.redis.pttl(key) == -1
    ]
    assert not forever, forever[:20]
    report = await replicas.run_job(replicas.live()[0], "reconcile")
    assert report["mismatch_count"] == 0, report
    for replica in replicas.live():
        assert (await replica.client.get("/readyz")).status_code == 200, replica.name

    expired = Counter(s.fate for s in traffic.seats)
    counts = {kind: len(events) for kind, events in by_type.items()}
    mean_ms = {}  # over the replicas alive at the end
    for operation, route in (
        ("join", "/v1/activities/{activity_id}/locks"),
        ("confirm", "/v1/activities/{activity_id}/teams/{team_id}/members"),
        ("grab", "/v1/redpackets/{packet_id}/grab"),
    ):
        both = [await replica.latency(route) for replica in replicas.live()]
        requests = sum(n for _, n in both)
        mean_ms[operation] = round(1000 * sum(t for t, _ in both) / max(1, requests), 1)
    with capsys.disabled():
        print(
            f"\n[replicas {REPLICAS}] set up in {prepare_s:.1f} s; {traffic.calls} calls until "
            f"{storm_s:.1f} s "
            f"({dict(sorted(traffic.answers.items()))}); seats {dict(expired)}; "
            f"{happened.instants} seat instants checked; lease holders in turn "
            f"{holders} ({happened.killed.name} killed at {KILL_AT_S} s, "
            f"{happened.stopped.name} stopped at {STOP_AT_S} s in {happened.stop_s:.1f} s, "
            f"{happened.replacement.name} started); calls cut off and sent "
            f"again {dict(sorted(replicas.cut_off.items()))}; all ended and recorded "
            f"{ended_s:.1f} s after the start; events {counts}; Redis keys left at the end "
            f"{len(kept)} (each with a TTL); mean ms per call {mean_ms}"
        )
