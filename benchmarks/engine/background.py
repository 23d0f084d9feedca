"""background: what the scheduled jobs cost while nearly everything is idle, and how soon a
grab's credit reaches SQL while they run at their configured intervals
(docs/benchmarking.md says how).

Guards the write-behind: a credit in SQL within 2 s (SPEC), idle rounds under a ms.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from groupbuy_client.wire import from_ms
from sqlalchemy import delete, select

from benchmarks.engine.common import create_packets, flash_requests, groupbuy_grab, say
from benchmarks.harness import Meter, Row, gather_limited, make_row, percentile
from groupbuy.locks.models import ActivityRow, TeamRow
from groupbuy.redpacket.codec import grab_credit_key
from groupbuy.redpacket.models import LedgerEntryRow, PacketRow
from groupbuy.services import Services, build_scheduler
from tests.support.console_seed import bulk_insert

ROUND_BUDGET_S = 90.0  # stop measuring rounds after this long (the old code took minutes)
FLASH_PACKETS, FLASH_GAP_S = 5, 0.37  # flash grabs spread over the flush interval
CREDIT_POLL_S = 0.01
CREDIT_TIMEOUT_S = 120.0


async def create_idle(services: Services, packets: int, activities: int, run: str) -> None:
    """`packets` live one-share packets (SQL rows in bulk, Redis state through packet_create,
    pipelined) and `activities` activities (SQL rows in bulk, an open team each opened
    through the service, which puts the activity in Redis and records the team)."""
    now = await services.clock.now_ms(services.redis)
    pids = [f"idle-{run}-{i}" for i in range(packets)]
    aids = [f"idle-{run}-{i}" for i in range(activities)]
    await bulk_insert(services, PacketRow, [
        {"packet_id": pid, "sender_id": f"idle-{run}", "amount_cents": 10, "count": 1,
         "strategy": "equal", "expires_in_s": 3600, "status": "active", "refunded_cents": 0,
         "records_done": False, "redis_cleared": False, "created_at": from_ms(now),
         "expires_at": from_ms(now + 3_600_000)}
        for pid in pids
    ])  # fmt: skip
    await create_packets(services, pids, 1, f"idle-{run}")
    await bulk_insert(services, ActivityRow, [
        {"activity_id": aid, "name": None, "team_size": 3, "lock_ttl_s": 300,
         "team_deadline_s": 86400, "created_at": from_ms(now)}
        for aid in aids
    ])  # fmt: skip
    opens: list[Callable[[], Awaitable[Any]]] = [
        partial(services.teams.activities.open_team, aid, "leader", team_id="t0") for aid in aids
    ]
    await gather_limited(opens, limit=64)


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) of one awaited call."""
    cpu, wall = time.process_time(), time.perf_counter()
    await call()
    return time.process_time() - cpu, time.perf_counter() - wall


def round_row(name: str, cpu: list[float], wall: list[float], packets: int, activities: int) -> Row:
    """One row of idle rounds: wall-time percentiles in the latency columns, CPU as extras."""
    cpu_ms: dict[str, Any] = {
        "cpu_ms_median": round(statistics.median(cpu) * 1000, 3),
        "cpu_ms_max": round(max(cpu) * 1000, 3),
        "wall_ms_median": round(statistics.median(wall) * 1000, 3),
        "wall_ms_max": round(max(wall) * 1000, 3),
    }
    note = (
        f"{packets:,} live packets, {activities:,} activities; {len(wall)} rounds: CPU median "
        f"{cpu_ms['cpu_ms_median']} ms, max {cpu_ms['cpu_ms_max']} ms; wall median "
        f"{cpu_ms['wall_ms_median']} ms, max {cpu_ms['wall_ms_max']} ms"
    )
    return make_row(
        "idle_rounds",
        f"groupbuy {name}",
        sum(wall),
        wall,
        {"rounds": len(wall)},
        note,
        live_packets=packets,
        activities=activities,
        **cpu_ms,
    )


async def idle_rounds(services: Services, packets: int, activities: int, rounds: int) -> list[Row]:
    """CPU and wall time of idle flush_records rounds and idle sweep rounds."""
    jobs = services.jobs

    async def sweeps() -> None:
        for name in ("sweep_locks", "expire_teams", "expire_packets"):
            await jobs.run(name)

    async def flush() -> None:
        await jobs.run("flush_records")

    await flush()  # whatever the set-up left behind, before measuring idle rounds
    await sweeps()
    rows = []
    for name, call in (("flush_records", flush), ("sweeps", sweeps)):
        cpu: list[float] = []
        wall: list[float] = []
        began = time.perf_counter()
        while len(wall) < rounds and (not wall or time.perf_counter() - began < ROUND_BUDGET_S):
            spent, took = await timed(call)
            cpu.append(spent)
            wall.append(took)
        rows.append(round_row(name, cpu, wall, packets, activities))
    return rows


class CreditWatch:
    """Polls the ledger for new grab credits and notes when each became visible."""

    def __init__(self, services: Services) -> None:
        self._db = services.database
        self.seen: dict[str, float] = {}
        self._last_id = 0

    async def start_from_now(self) -> None:
        async with self._db.sessions() as session:
            last = await session.scalar(
                select(LedgerEntryRow.id).order_by(LedgerEntryRow.id.desc())
            )
        self._last_id = int(last or 0)

    async def poll(self) -> None:
        async with self._db.sessions() as session:
            rows = (
                await session.execute(
                    select(LedgerEntryRow.id, LedgerEntryRow.business_key)
                    .where(LedgerEntryRow.id > self._last_id)
                    .order_by(LedgerEntryRow.id)
                )
            ).all()
        now = time.perf_counter()
        for entry_id, key in rows:
            self._last_id = max(self._last_id, int(entry_id))
            self.seen.setdefault(key, now)

    async def until(self, keys: set[str], timeout_s: float) -> None:
        deadline = time.perf_counter() + timeout_s
        while not keys <= self.seen.keys() and time.perf_counter() < deadline:
            await self.poll()
            await asyncio.sleep(CREDIT_POLL_S)


async def credit_latency(
    services: Services, shares: int, users: int, run: str, packets: int, activities: int
) -> Row:
    """Flash grabs with the scheduler running every job at its interval; per grab, the
    delay from its answer to its ledger credit in SQL."""
    scheduler = build_scheduler(services)
    scheduler.start()
    watch = CreditWatch(services)
    await watch.start_from_now()
    answered: dict[str, float] = {}
    meter = Meter()
    stop = asyncio.Event()

    async def poller() -> None:
        while not stop.is_set():
            await watch.poll()
            await asyncio.sleep(CREDIT_POLL_S)

    async def grab(packet_id: str, user: str) -> None:
        answer = await meter.measure(partial(groupbuy_grab, services, packet_id, user))
        if answer["status"] == "grabbed":
            answered[grab_credit_key(packet_id, user)] = time.perf_counter()

    polling = asyncio.create_task(poller())
    began = time.perf_counter()
    try:
        for _ in range(50):  # the lease is taken at start; wait for it
            if scheduler.is_leader:
                break
            await asyncio.sleep(0.02)
        sender = f"flash-sender-{run}"
        await services.packets.accounts.deposit(
            sender, FLASH_PACKETS * shares * 100, f"credit-{run}"
        )
        rng = random.Random(7)
        for p in range(FLASH_PACKETS):
            packet_id = f"credit-{run}-{p}"
            await services.packets.sending.send(sender, shares * 100, shares, packet_id=packet_id)
            requests = flash_requests(users, rng)
            await asyncio.gather(*(grab(packet_id, u) for u in requests))
            await asyncio.sleep(FLASH_GAP_S)
        await watch.until(set(answered), CREDIT_TIMEOUT_S)
    finally:
        stop.set()
        await polling
        await scheduler.stop()
    seconds = time.perf_counter() - began
    delays = sorted(watch.seen[key] - at for key, at in answered.items() if key in watch.seen)
    missing = len(answered) - len(delays)
    note = (
        f"{shares} shares, {users} users; {packets:,} live packets, {activities:,} activities; "
        f"max {percentile(delays, 1.0)} ms; {len(delays)} of {len(answered)} credits seen "
        f"(grab latency p99 {percentile(sorted(meter.latencies), 0.99)} ms)"
    )
    return make_row(
        "credit_latency",
        "groupbuy write-behind",
        seconds,
        delays,
        {"grabbed": len(answered), "credited": len(delays), "missing": missing},
        note,
        live_packets=packets,
        activities=activities,
    )


async def forget(services: Services, run: str) -> None:
    """Remove this run's idle rows from SQL, so later scenarios do not carry them."""
    pattern = f"idle-{run}-%"
    async with services.database.transaction() as session:
        await session.execute(delete(PacketRow).where(PacketRow.packet_id.like(pattern)))
        await session.execute(delete(TeamRow).where(TeamRow.activity_id.like(pattern)))
        await session.execute(delete(ActivityRow).where(ActivityRow.activity_id.like(pattern)))


async def background(
    services: Services,
    run: str,
    packets: int,
    activities: int,
    rounds: int = 20,
    shares: int = 1000,
    users: int = 1500,
) -> list[Row]:
    """The idle rounds, then the credit latency, with the same idle packets and activities."""
    began = time.perf_counter()
    await create_idle(services, packets, activities, run)
    say(
        f"background: {packets:,} live packets and {activities:,} activities created in "
        f"{time.perf_counter() - began:.1f} s"
    )
    try:
        rows = await idle_rounds(services, packets, activities, rounds)
        rows.append(await credit_latency(services, shares, users, run, packets, activities))
    finally:
        await forget(services, run)
    return rows
