"""SQL made unavailable under a storm, on either database, and the calls that need SQL.

Two outages, one shape (`stop`, `snapshot`, `reopen`):

- PostgreSQL crashes (`pg_ctl stop -m immediate`) and comes back on its data. Before the
  service can reach it again it is started on its Unix socket only, and the members it
  holds are read there: what SQL had committed when the outage ended.
- SQLite is locked by another connection (`BEGIN EXCLUSIVE`), which also reads the
  members before letting go: nothing else can commit while it holds the lock. Readers
  are not blocked (WAL); writers wait `[database] timeout_s`, then fail.

`SqlCalls` drives the calls that need SQL through the HTTP app, each caller in one lane:
confirms (a join, then the confirm), deposits, sends, reads of the events feed and of
accounts. Every answer is kept with when it was sent and answered. A write answered 503
is retried after the outage with the same ids, as a backend would.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from tests.support.http import ADMIN, SERVICE
from tests.support.postgres import USER, PostgresProcess

ACTIVITY = "club"
PAYER = "payer"  # the sender of the packets the send lane creates
ACCOUNTS = 20  # accounts the deposit and account lanes use, a0 .. a19
SQL_DOWN = "503 database_unavailable"
WRITES = ("confirm", "deposit", "send")
READS = ("events", "account")

MembersQuery = "SELECT user_id, order_id FROM team_members WHERE activity_id = 'club'"


class Outage(Protocol):
    """A way to make SQL unavailable to the service and to give it back."""

    reads_fail: bool  # whether reads fail too (PostgreSQL) or only writes (SQLite, WAL)

    async def stop(self) -> None:
        """Make SQL unavailable; returns once it is."""

    async def snapshot(self) -> set[tuple[str, str]]:
        """The (user, order) members of the activity SQL holds now, read where the service
        cannot write: what it had committed before the outage."""

    async def reopen(self) -> None:
        """Give SQL back; returns once the service can reach it."""


class PostgresCrash:
    """PostgreSQL killed (`-m immediate`) and started again on the same data."""

    reads_fail = True

    def __init__(self, server: PostgresProcess, database: str) -> None:
        self.server = server
        self.database = database

    async def stop(self) -> None:
        await asyncio.to_thread(self.server.crash)

    async def snapshot(self) -> set[tuple[str, str]]:
        import asyncpg

        await asyncio.to_thread(self.server.start, False)  # the Unix socket only
        connection = await asyncpg.connect(
            host=str(self.server.directory),
            port=self.server.port,
            user=USER,
            database=self.database,
        )
        try:
            rows = await connection.fetch(MembersQuery)
        finally:
            await connection.close()
        await asyncio.to_thread(self.server.stop_fast)
        return {(row["user_id"], row["order_id"]) for row in rows}

    async def reopen(self) -> None:
        await asyncio.to_thread(self.server.start)


async def exclusive_lock(path: Path) -> sqlite3.Connection:
    """A connection holding SQLite's write lock. Tried without waiting, again and again: a
    blocking wait would stop the event loop whose write-behind may hold the lock right now."""
    locker = sqlite3.connect(path, timeout=0, isolation_level=None)
    deadline = time.monotonic() + 30
    while True:
        try:
            locker.execute("BEGIN EXCLUSIVE")
            return locker
        except sqlite3.OperationalError:
            assert time.monotonic() < deadline, "could not take the SQLite write lock"
            await asyncio.sleep(0.01)


class SqliteLock:
    """Another connection holds SQLite's write lock."""

    reads_fail = False

    def __init__(self, path: Path) -> None:
        self.path = path
        self.locker: sqlite3.Connection | None = None

    async def stop(self) -> None:
        self.locker = await exclusive_lock(self.path)

    async def snapshot(self) -> set[tuple[str, str]]:
        assert self.locker is not None
        return {(user, order) for user, order in self.locker.execute(MembersQuery)}

    async def reopen(self) -> None:
        assert self.locker is not None
        self.locker.execute("ROLLBACK")
        self.locker.close()
        self.locker = None


@dataclass(frozen=True)
class Answer:
    """One call and its answer: what, with which ids, when (monotonic s), and the outcome."""

    kind: str
    ids: tuple[str, ...]
    sent: float
    answered: float
    status: int
    outcome: str  # "2xx", or the status and problem code
    body: Any
    retry: bool  # made after the storm, for a write answered 503 before


@dataclass
class SqlCalls:
    """Callers in lanes (`lanes`: one caller per entry, named by kind), each pausing `pause_s`
    between calls."""

    client: httpx.AsyncClient
    lanes: tuple[str, ...] = (*("confirm",) * 4, "deposit", "deposit", "send", "send")
    lanes_reading: tuple[str, ...] = ("events", "account")
    teams: int = 40
    team_size: int = 20
    pause_s: float = 0.05
    answers: list[Answer] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    confirmed: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # user: team, order
    deposited: dict[str, int] = field(default_factory=dict)  # reference: cents
    sent_packets: set[str] = field(default_factory=set)
    _retry: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    async def prepare(self) -> None:
        """The activity and its teams, and the payer's money (before any fault)."""
        body: dict[str, Any] = {"activity_id": ACTIVITY, "team_size": self.team_size}
        await self._must("POST", "/v1/activities", body, ADMIN, 201)
        for i in range(self.teams):
            body = {"leader_id": f"lead{i}", "team_id": f"c{i}"}
            await self._must("POST", f"/v1/activities/{ACTIVITY}/teams", body, SERVICE, 201)
        body = {"amount_cents": 10**9, "reference": "payer-funds"}
        await self._must("POST", f"/v1/accounts/{PAYER}/deposits", body, ADMIN, 201)
        self.deposited["payer-funds"] = 10**9

    async def _must(
        self, method: str, path: str, body: dict[str, Any], headers: dict[str, str], status: int
    ) -> None:
        response = await self.client.request(method, path, json=body, headers=headers)
        assert response.status_code == status, (path, response.status_code, response.text)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._lane(kind, i))
            for i, kind in enumerate((*self.lanes, *self.lanes_reading))
        ]

    async def stop(self, retry_for_s: float = 60) -> None:
        """Stop making new calls, then retry every write answered 503 until it is answered."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        deadline = time.monotonic() + retry_for_s
        while self._retry:
            assert time.monotonic() < deadline, f"{len(self._retry)} writes still unanswered"
            pending, self._retry = self._retry, []
            for kind, ids in pending:
                await self._call(kind, ids, retry=True)
            if self._retry:
                await asyncio.sleep(0.2)

    async def _lane(self, kind: str, index: int) -> None:
        while not self._stop.is_set():
            n = next(self._ids)
            if kind == "confirm":
                user = f"u{n}"
                team = await self._join(user)
                if team is None:
                    return  # every seat is taken: this lane is done
                await self._call("confirm", (team, user, f"o{n}"))
            elif kind == "deposit":
                await self._call("deposit", (f"a{n % ACCOUNTS}", f"d{n}"))
            elif kind == "send":
                await self._call("send", (f"s{n}",))
            elif kind == "events":
                await self._call("events", ())
            else:
                await self._call("account", (f"a{n % ACCOUNTS}",))
            await asyncio.sleep(self.pause_s)

    async def _join(self, user: str) -> str | None:
        """A seat lock in the activity (Redis only: it answers whatever SQL does)."""
        response = await self.client.post(
            f"/v1/activities/{ACTIVITY}/locks", json={"user_id": user}, headers=SERVICE
        )
        if response.status_code == 201:
            return str(response.json()["team_id"])
        if response.status_code != 409 or response.json().get("code") != "no_team_available":
            self.unexpected.append(f"join {user}: {response.status_code} {response.text}")
        return None

    async def _call(self, kind: str, ids: tuple[str, ...], retry: bool = False) -> None:
        sent = time.monotonic()
        try:
            response = await self._request(kind, ids)
        except httpx.HTTPError as exc:  # the app raised instead of answering
            self.unexpected.append(f"{kind} {ids}: {type(exc).__name__}: {exc}")
            return
        body = response.json()
        status = response.status_code
        outcome = "2xx" if status in (200, 201) else f"{status} {body.get('code')}"
        answer = Answer(kind, ids, sent, time.monotonic(), status, outcome, body, retry)
        self.answers.append(answer)
        if outcome == SQL_DOWN:
            if kind in WRITES:
                self._retry.append((kind, ids))
            return
        if outcome != "2xx":
            self.unexpected.append(f"{kind} {ids}: {status} {response.text}")
            return
        if kind == "confirm":
            team, user, order = ids
            members = {m["user_id"]: m["order_id"] for m in body["team"]["members"]}
            if members.get(user) != order or body["team"]["team_id"] != team:
                self.unexpected.append(f"confirm {ids} answered another team: {body}")
            self.confirmed[user] = (team, order, status)
        elif kind == "deposit":
            self.deposited[ids[1]] = 100
        elif kind == "send":
            self.sent_packets.add(ids[0])

    async def _request(self, kind: str, ids: tuple[str, ...]) -> httpx.Response:
        post = self.client.post
        if kind == "confirm":
            team, user, order = ids
            return await post(
                f"/v1/activities/{ACTIVITY}/teams/{team}/members",
                json={"user_id": user, "order_id": order},
                headers=SERVICE,
            )
        if kind == "deposit":
            account, reference = ids
            body = {"amount_cents": 100, "reference": reference}
            return await post(f"/v1/accounts/{account}/deposits", json=body, headers=ADMIN)
        if kind == "send":
            body = {"sender_id": PAYER, "amount_cents": 50, "count": 5, "packet_id": ids[0]}
            return await post("/v1/redpackets", json=body, headers=SERVICE)
        if kind == "events":
            return await self.client.get("/v1/events?after=0&limit=20", headers=SERVICE)
        return await self.client.get(f"/v1/accounts/{ids[0]}", headers=SERVICE)

    def outcomes(self) -> dict[str, Counter[str]]:
        """Every answer by kind and outcome."""
        by_kind: dict[str, Counter[str]] = {}
        for answer in self.answers:
            by_kind.setdefault(answer.kind, Counter())[answer.outcome] += 1
        return by_kind
