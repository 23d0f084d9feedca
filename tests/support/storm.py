"""The fault matrix's shared parts: a real redis-server to hurt, a storm of grabs and seat
locks through the HTTP app, and the end-of-test checks every fault test runs.

A storm runs until the test stops it (after its fault is over), then retries every call
whose last answer was not definitive (a 503, a dropped call) until it is, as a client
would; each (packet, user) pair or joining user has then exactly one definitive answer
to hold the records against. `check_after_storm` drains the write-behind and checks:
no 5xx but 503, money conserved, exactly one grab row and one ledger credit for every
`grabbed` answer (and nothing else), every seat told `locked` held once, /readyz 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import uvicorn
from sqlalchemy import select
from starlette.applications import Starlette

from groupbuy.api.app import create_app
from groupbuy.redpacket.codec import grab_credit_key
from groupbuy.redpacket.models import GrabRow, LedgerEntryRow
from groupbuy.services import Services
from groupbuy.settings import Settings, load_settings
from tests.support.http import ADMIN, SERVICE
from tests.support.money import assert_money_conserved
from tests.support.servers import RedisProcess, free_port, start_redis
from tests.support.settings import API_KEYS

# AOF with an fsync before every reply: what the guarantees of SPEC §4.5 are stated for.
PERSIST = ("--appendonly", "yes", "--appendfsync", "always")
# A client gives up on Redis after this (and resends a few times): bounded waits while it
# is stopped or gone, so each test stays within seconds of its fault.
SOCKET_TIMEOUT_S = 0.5
# The answers a call may end with; anything else is retried after the fault.
DEFINITIVE = {"grabbed", "already_grabbed", "sold_out", "locked", "existing", "no_team_available"}


class RedisUnderTest:
    """A redis-server with AOF `appendfsync always` that a test can kill, stop and restart."""

    def __init__(self, data: Path) -> None:
        self.port = free_port()
        self.data = data
        self.data.mkdir(exist_ok=True)
        self.server: RedisProcess = start_redis(*PERSIST, port=self.port, directory=self.data)

    @property
    def url(self) -> str:
        return self.server.url

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)

    def kill(self) -> None:
        """kill -9: nothing is flushed on the way out (the AOF has every acknowledged write)."""
        self.server.process.kill()
        self.server.process.wait()

    def restart(self) -> None:
        """Start again on the same port and data (the AOF is replayed)."""
        self.server = start_redis(*PERSIST, port=self.port, directory=self.data)

    def pause(self) -> None:
        """SIGSTOP: the process holds its connections and answers nothing."""
        os.kill(self.server.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.server.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.resume()
        self.server.stop()


def storm_settings(redis_url: str, database_url: str, **more: str) -> Settings:
    """The service as deployed, on this Redis and this database, with short Redis timeouts
    (`more`: further GROUPBUY_* variables)."""
    return load_settings(
        None,
        {
            "GROUPBUY_API_KEYS": API_KEYS,
            "GROUPBUY_DATABASE_URL": database_url,
            "GROUPBUY_REDIS_URL": redis_url,
            "GROUPBUY_REDIS_SOCKET_TIMEOUT_S": str(SOCKET_TIMEOUT_S),
            "GROUPBUY_OUTBOX_FLUSH_INTERVAL_S": "0.1",
            **more,
        },
    )


class ReadinessNotRestored(AssertionError):
    """/readyz still says the scripts Redis forgot are not loaded once the fault is over."""


class OutOfMemoryNotRefused(AssertionError):
    """Calls made while Redis was over maxmemory answered 500 instead of 503
    redis_out_of_memory."""


@contextlib.asynccontextmanager
async def running_app(settings: Settings) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """The app with its lifespan running (scheduler included), and a client calling it in
    process through ASGI."""
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        # An error the app did not handle is a 500 answer to count, not an exception.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://groupbuy.test", timeout=60
        ) as client:
            yield app, client


@contextlib.asynccontextmanager
async def served_app(settings: Settings) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    """The app served by uvicorn on a loopback port, in this event loop, and a client that
    keeps its connections alive: a connection the server drops or resets (what uvicorn does
    after an exception escapes the app) is a transport error the storm counts."""
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="on",
            # Longer than any pause of a test: an idle connection closed by the server just
            # as the client reuses it would look like a reset.
            timeout_keep_alive=120,
        )
    )
    serving = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 30
    while not server.started:
        assert not serving.done() and time.monotonic() < deadline, "uvicorn did not start"
        await asyncio.sleep(0.02)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield app, client
    finally:
        server.should_exit = True
        await serving


def services_of(app: Starlette) -> Services:
    services = app.state.services
    assert isinstance(services, Services)
    return services


@dataclass
class Storm:
    """Grabs of a few big packets and joins of an activity's teams, by concurrent callers."""

    client: httpx.AsyncClient
    packets: int = 3
    shares: int = 2000
    teams: int = 30
    team_size: int = 3
    callers: int = 12
    rate: float = 300.0  # calls per second over all callers, roughly
    join_share: float = 0.15  # the part of calls that are seat joins
    # Each caller works one lane only, a packet's grabs or the activity's joins (callers
    # spread evenly): a lane stalled on one shard then slows no caller of the others, as
    # with separate clients. Otherwise every caller picks at random.
    lanes: bool = False
    packet_names: tuple[str, ...] = ()  # the packets' ids (default pk0, pk1, ...)
    answers: Counter[str] = field(default_factory=Counter)  # every answer, by kind
    grabs: dict[tuple[str, str], int] = field(default_factory=dict)  # definitive amounts
    grab_final: dict[tuple[str, str], str] = field(default_factory=dict)
    seats: dict[str, str] = field(default_factory=dict)  # user -> team told `locked`
    join_final: dict[str, str] = field(default_factory=dict)
    told_oom: set[tuple[str, str]] = field(default_factory=set)
    applied_despite_error: int = 0
    unexpected: list[str] = field(default_factory=list)  # 5xx other than 503, and the odd
    calls: int = 0
    timeline: list[tuple[float, str, str]] = field(default_factory=list)  # (when, lane, answer)
    _retry: list[tuple[str, ...]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def packet_ids(self) -> list[str]:
        return list(self.packet_names) or [f"pk{i}" for i in range(self.packets)]

    async def prepare(self) -> None:
        """Fund the sender, send the packets, open the teams (before any fault)."""
        amount = 10 * self.shares
        await self._must(
            "POST",
            "/v1/accounts/sender/deposits",
            {"amount_cents": amount * len(self.packet_ids), "reference": "storm-funds"},
            ADMIN,
            201,
        )
        for packet_id in self.packet_ids:
            body = {
                "sender_id": "sender",
                "amount_cents": amount,
                "count": self.shares,
                "packet_id": packet_id,
            }
            await self._must("POST", "/v1/redpackets", body, SERVICE, 201)
        await self._must("POST", "/v1/activities", {"activity_id": "act"}, ADMIN, 201)
        for i in range(self.teams):
            body = {"leader_id": f"leader{i}", "team_id": f"t{i}"}
            await self._must("POST", "/v1/activities/act/teams", body, SERVICE, 201)

    async def _must(
        self, method: str, path: str, body: dict[str, Any], headers: dict[str, str], status: int
    ) -> Any:
        response = await self.client.request(method, path, json=body, headers=headers)
        assert response.status_code == status, (path, response.status_code, response.text)
        return response.json()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._caller(i)) for i in range(self.callers)]

    async def wait_calls(self, calls: int, timeout_s: float = 60) -> None:
        """Until the storm has made this many calls."""
        deadline = time.monotonic() + timeout_s
        while self.calls < calls:
            assert time.monotonic() < deadline, f"the storm made only {self.calls} calls"
            await asyncio.sleep(0.02)

    async def stop(self, retry_for_s: float = 60) -> None:
        """Stop making new calls, then retry every undecided one until it is decided."""
        self._stop.set()
        await asyncio.gather(*self._tasks)
        deadline = time.monotonic() + retry_for_s
        while self._retry:
            assert time.monotonic() < deadline, f"{len(self._retry)} calls still undecided"
            pending, self._retry = self._retry, []
            for call in pending:
                await self._call(*call)
            if self._retry:
                await asyncio.sleep(0.2)

    async def _caller(self, index: int) -> None:
        pause = self.callers / self.rate
        rng = random.Random(index)
        lanes = [*self.packet_ids, "join"]
        lane = lanes[index % len(lanes)]
        while not self._stop.is_set():
            n = next(self._ids)
            if self.lanes:
                joins = lane == "join"
                packet_id = lane
            else:
                joins = rng.random() < self.join_share
                packet_id = rng.choice(self.packet_ids)
            if joins:
                await self._call("join", f"j{n}")
            else:
                await self._call("grab", packet_id, f"g{n}")
            await asyncio.sleep(pause * rng.uniform(0.5, 1.5))

    async def _call(self, kind: str, *args: str) -> None:
        self.calls += 1
        try:
            if kind == "grab":
                packet_id, user_id = args
                response = await self.client.post(
                    f"/v1/redpackets/{packet_id}/grab", json={"user_id": user_id}, headers=SERVICE
                )
            else:
                (user_id,) = args
                response = await self.client.post(
                    "/v1/activities/act/locks", json={"user_id": user_id}, headers=SERVICE
                )
        except httpx.HTTPError as exc:  # the app raised instead of answering
            self.unexpected.append(f"{kind} {args}: {type(exc).__name__}: {exc}")
            self.answers["transport_error"] += 1
            self.timeline.append((time.monotonic(), args[0] if kind == "grab" else "join", "error"))
            self._retry.append((kind, *args))
            return
        outcome = _outcome(response)
        self.answers[outcome] += 1
        self.timeline.append((time.monotonic(), args[0] if kind == "grab" else "join", outcome))
        if response.status_code >= 500 and response.status_code != 503:
            self.unexpected.append(f"{kind} {args}: {response.status_code} {response.text}")
        if outcome not in DEFINITIVE:
            if outcome == "503 redis_out_of_memory" and kind == "grab":
                self.told_oom.add((args[0], args[1]))
            self._retry.append((kind, *args))
            return
        body = response.json()
        if kind == "grab":
            key = (args[0], args[1])
            if outcome == "already_grabbed" and key not in self.grabs:
                # decided by an earlier call answered with an error, or by redis-py's
                # resend of this call after a timeout (the first one ran when Redis woke up)
                self.applied_despite_error += 1
            if outcome in ("grabbed", "already_grabbed"):
                previous = self.grabs.setdefault(key, int(body["amount_cents"]))
                assert previous == body["amount_cents"], (key, previous, body)
            self.grab_final[key] = outcome
        else:
            if outcome == "existing" and args[0] not in self.seats:
                self.applied_despite_error += 1
            if outcome in ("locked", "existing"):
                self.seats[args[0]] = body["team_id"]
            self.join_final[args[0]] = outcome

    def summary(self) -> str:
        answers = ", ".join(f"{kind} {n}" for kind, n in sorted(self.answers.items()))
        return (
            f"{self.calls} calls ({answers}); {len(self.grabs)} grabs told grabbed, "
            f"{len(self.seats)} seats told locked; {self.applied_despite_error} first answers "
            "already_grabbed/existing (applied by an earlier call answered with an error, or "
            "by the client's own resend after a timeout)"
        )


def _outcome(response: httpx.Response) -> str:
    """What an answer says: the success status, or the status and problem code."""
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} non-json"
    if response.status_code == 200 and "status" in body:
        return str(body["status"])
    if response.status_code == 201:
        return "locked"
    if response.status_code == 200 and body.get("existing"):
        return "existing"
    if response.status_code == 409:
        return str(body.get("code"))
    return f"{response.status_code} {body.get('code')}"


@dataclass
class Figures:
    """What the end-of-test check measured, printed and returned for the report."""

    calls: int
    grabbed: int
    seats: int
    lost: int
    duplicated: int
    unexpected_5xx: int
    answers: dict[str, int]


async def drain(client: httpx.AsyncClient, timeout_s: float = 120) -> None:
    """Run the write-behind until nothing waits (the scheduler may be running it too)."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = await client.post("/v1/admin/jobs/flush_records/run", headers=ADMIN)
        if response.status_code == 200 and response.json()["backlog"] == 0:
            return
        assert time.monotonic() < deadline, f"the write-behind did not drain: {response.text}"
        await asyncio.sleep(0.2)


async def wait_ready(client: httpx.AsyncClient, timeout_s: float = 10) -> httpx.Response:
    """/readyz until it answers 200, or its last answer after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = await client.get("/readyz")
        if response.status_code == 200 or time.monotonic() > deadline:
            return response
        await asyncio.sleep(0.1)


async def check_after_storm(
    name: str, storm: Storm, app: Starlette, client: httpx.AsyncClient, **faults: object
) -> Figures:
    """The checks every fault test ends with; prints the figures (`pytest -s`) and returns
    them. Everything is asserted with the figures in the message."""
    services = services_of(app)
    await drain(client)
    async with services.database.sessions() as session:
        rows = {
            (p, u): cents
            for p, u, cents in await session.execute(
                select(GrabRow.packet_id, GrabRow.user_id, GrabRow.amount_cents)
            )
        }
        credits = Counter(
            await session.scalars(
                select(LedgerEntryRow.business_key).where(LedgerEntryRow.kind == "grab_credit")
            )
        )
    lost = [key for key in storm.grabs if rows.get(key) != storm.grabs[key]]
    extra = [key for key in rows if key not in storm.grabs]
    missing_credit = [key for key in storm.grabs if credits[grab_credit_key(*key)] != 1]
    duplicated = len(extra) + sum(n - 1 for n in credits.values() if n > 1)
    seats_wrong = await _check_seats(client, storm)
    figures = Figures(
        calls=storm.calls,
        grabbed=len(storm.grabs),
        seats=len(storm.seats),
        lost=len(lost) + len(missing_credit),
        duplicated=duplicated,
        unexpected_5xx=len(storm.unexpected),
        answers=dict(storm.answers),
    )
    line = (
        f"[fault {name}] {storm.summary()}; faults {faults}; lost {figures.lost}, "
        f"duplicated {figures.duplicated}, 5xx other than 503: {figures.unexpected_5xx}"
    )
    print(f"\n{line}")
    assert not storm.unexpected, (line, storm.unexpected[:5])
    assert not lost and not missing_credit and not extra, (line, lost[:5], extra[:5])
    assert duplicated == 0, line
    assert not seats_wrong, (line, seats_wrong[:5])
    await assert_money_conserved(services)
    ready = await wait_ready(client)
    if ready.status_code != 200 and ready.json()["checks"].get("scripts") == "not loaded":
        raise ReadinessNotRestored(line, ready.text)
    assert ready.status_code == 200, (line, ready.text)
    return figures


async def _check_seats(client: httpx.AsyncClient, storm: Storm) -> list[str]:
    """Every user told `locked` holds exactly one lock, in the team named; no team over
    its size; no lock held by a user never told `locked`."""
    wrong: list[str] = []
    held: dict[str, str] = {}
    for team_id in sorted({f"t{i}" for i in range(storm.teams)} | set(storm.seats.values())):
        response = await client.get(f"/v1/activities/act/teams/{team_id}", headers=SERVICE)
        team = response.json()
        taken = len(team["members"]) + len(team["locks"])
        if taken + team["free_seats"] != team["size"] or taken > team["size"]:
            wrong.append(f"{team_id} over-filled: {team}")
        for seat in team["locks"]:
            if seat["user_id"] in held:
                wrong.append(f"{seat['user_id']} holds two seats")
            held[seat["user_id"]] = team_id
    if held != storm.seats:
        wrong.append(
            f"locks held {len(held)} != told locked {len(storm.seats)}: "
            f"{sorted(set(held.items()) ^ set(storm.seats.items()))[:5]}"
        )
    return wrong
