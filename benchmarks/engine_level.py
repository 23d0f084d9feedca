"""Engine-level benchmark: the services called in-process, no HTTP, on a real redis-server.

Scenarios (each a list of result rows, see `run_engine`):

- flash_grab: one red packet, thousands of users (60% of them tap twice), 256 at once;
  groupbuy (one EVALSHA per grab) against a naive SETNX-mutex baseline (benchmarks/naive.py).
- lock_storm: users lock, switch, unlock and confirm seats in the teams of one activity
  while MULTI snapshots check that no team is over-filled and nobody holds two locks;
  groupbuy against the naive baseline.
- mixed: 20 activities and 50 packets at once, grabs and seat locks interleaved.
- evalsha_grab / evalsha_lock: redis-benchmark running the project's own scripts by
  EVALSHA (the ceiling without any Python), plain and pipelined (-P 16).
- scaling: the grab and lock rates with 10^3..10^5 live packets / teams, and the Redis
  memory per live packet, team, grab and lock.

Run it alone (starts and stops a private redis-server, quick sizes):

    cd /work/main && .venv/bin/python -m benchmarks.engine_level [--full]

benchmarks/run.py calls `run_engine(redis_url, database_url, quick)`.
"""

from __future__ import annotations

import asyncio
import random
import re
import secrets
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from benchmarks.naive import NaivePackets, NaiveTeams, TooManyPeople
from groupbuy import errors
from groupbuy.services import Services, build_services, settle_heap
from groupbuy.settings import Settings
from groupbuy.storage.db import Database
from groupbuy.storage.redis_client import connect_redis
from groupbuy.storage.scripts import script_source

CONCURRENCY = 256
LATENCY_SAMPLE = 2000
TEAM_SIZE = 5


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is (full run or quick run)."""

    shares: int  # K, shares of the flash packet
    users: int  # U, users of the flash grab
    teams: int  # T, teams of the lock storm
    storm_users: int
    storm_steps: int
    mixed_users: int
    mixed_steps: int
    bench_requests: int  # redis-benchmark -n
    scaling_live: tuple[int, ...]
    scaling_ops: int


FULL = Sizes(1000, 5000, 200, 2000, 10, 2000, 6, 200_000, (10**3, 10**4, 10**5), 5_000)
QUICK = Sizes(200, 1000, 50, 300, 10, 300, 6, 25_000, (10**3, 10**4), 3_000)


def say(message: str) -> None:
    """One progress line."""
    print(f"[engine] {message}", flush=True)


# -- measuring ------------------------------------------------------------------------


class Meter:
    """Bounds concurrency with a semaphore and records each operation's latency."""

    def __init__(self, concurrency: int = CONCURRENCY) -> None:
        self.gate = asyncio.Semaphore(concurrency)
        self.latencies: list[float] = []
        self.by_label: dict[str, list[float]] = defaultdict(list)

    async def measure(self, operation: Callable[[], Awaitable[Any]], label: str = "") -> Any:
        """Run one operation when a slot is free; its latency excludes the wait for the slot."""
        async with self.gate:
            began = time.perf_counter()
            try:
                return await operation()
            finally:
                elapsed = time.perf_counter() - began
                self.latencies.append(elapsed)
                if label:
                    self.by_label[label].append(elapsed)

    def breakdown(self) -> dict[str, dict[str, Any]]:
        """Count, p50 and p99 (ms) of each labelled kind of operation."""
        result = {}
        for label, values in sorted(self.by_label.items()):
            ordered = sorted(values)
            result[label] = {
                "ops": len(ordered),
                "p50_ms": percentile(ordered, 0.5),
                "p99_ms": percentile(ordered, 0.99),
            }
        return result


def percentile(ordered: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of sorted seconds, in ms."""
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return round(ordered[index] * 1000, 3)


def make_row(
    scenario: str,
    implementation: str,
    seconds: float,
    latencies: list[float],
    correct: dict[str, Any],
    note: str,
    ops: int | None = None,
    level: str = "engine",
    **extra: Any,
) -> dict[str, Any]:
    """One result row in the shape benchmarks/run.py expects (extra keys allowed)."""
    ops = len(latencies) if ops is None else ops
    ordered = sorted(latencies)
    sample = ordered if len(ordered) <= LATENCY_SAMPLE else random.sample(ordered, LATENCY_SAMPLE)
    row = {
        "scenario": scenario,
        "level": level,
        "implementation": implementation,
        "ops": ops,
        "seconds": round(seconds, 4),
        "ops_per_s": round(ops / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": percentile(ordered, 0.50),
        "p95_ms": percentile(ordered, 0.95),
        "p99_ms": percentile(ordered, 0.99),
        "correct": correct,
        "latencies_ms": [round(s * 1000, 3) for s in sample],
        "note": note,
        **extra,
    }
    say(
        f"{scenario:<12} {implementation:<24} {row['ops_per_s']:>10,.0f} ops/s  "
        f"p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  {correct}"
    )
    return row


async def gather_limited(calls: list[Callable[[], Awaitable[Any]]], limit: int = 32) -> list[Any]:
    """Run set-up calls with bounded concurrency (not measured)."""
    return await asyncio.gather(*(Meter(limit).measure(c) for c in calls))


async def used_memory(redis: Any) -> int:
    """Redis's used_memory in bytes."""
    return int((await redis.info("memory"))["used_memory"])


# -- red packets: grading -------------------------------------------------------------


def grade_grabs(outcomes: list[tuple[str, dict[str, Any]]], count: int) -> dict[str, Any]:
    """Winners, duplicates and spurious failures of one packet's grab answers.

    Spurious: a non-winner refused with anything but sold_out, or a winner's other
    answer not `already_grabbed` with the same amount.
    """
    by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for user, outcome in outcomes:
        by_user[user].append(outcome)
    winners = duplicates = spurious = total = 0
    statuses: Counter[str] = Counter()
    for answers in by_user.values():
        statuses.update(a["status"] for a in answers)
        amounts = [a["amount_cents"] for a in answers if a["status"] == "grabbed"]
        if amounts:
            winners += 1
            total += amounts[0]
            duplicates += len(amounts) - 1
        for answer in answers:
            if answer["status"] == "grabbed":
                continue
            if amounts:
                same = answer["status"] == "already_grabbed"
                spurious += not (same and answer.get("amount_cents") == amounts[0])
            else:
                spurious += answer["status"] != "sold_out"
    return {
        "winners": winners,
        "over_capacity": max(0, winners - count),
        "duplicates": duplicates,
        "spurious_failures": spurious,
        "granted_cents": total,
        "outcomes": dict(statuses),
    }


def flash_requests(users: int, rng: random.Random) -> list[str]:
    """Every user once, 60% of them a second time (double taps), shuffled."""
    ids = [f"u{i}" for i in range(users)]
    requests = ids + rng.sample(ids, int(users * 0.6))
    rng.shuffle(requests)
    return requests


async def groupbuy_grab(services: Services, packet_id: str, user: str) -> dict[str, Any]:
    """The service's grab, with errors turned into a status."""
    try:
        return await services.packets.grab(packet_id, user)
    except errors.GroupBuyError as exc:
        return {"status": exc.code}


async def run_grabs(
    grab: Callable[[str, str], Awaitable[dict[str, Any]]], requests: list[tuple[str, str]]
) -> tuple[float, list[float], list[tuple[str, str, dict[str, Any]]]]:
    """(packet, user) requests at CONCURRENCY: seconds, latencies, answers."""
    meter = Meter()
    answers: list[tuple[str, str, dict[str, Any]]] = []

    async def one(packet_id: str, user: str) -> None:
        answers.append((packet_id, user, await meter.measure(lambda: grab(packet_id, user))))

    began = time.perf_counter()
    await asyncio.gather(*(one(p, u) for p, u in requests))
    return time.perf_counter() - began, meter.latencies, answers


# -- flash grab -----------------------------------------------------------------------


async def flash_grab_groupbuy(services: Services, sizes: Sizes, run: str) -> dict[str, Any]:
    """One packet of K shares, U users plus double taps, through RedPacketService.grab."""
    packet_id, amount = f"flash-{run}", sizes.shares * 100
    await services.packets.deposit(f"sender-{run}", amount, f"flash-{run}")
    await services.packets.send(f"sender-{run}", amount, sizes.shares, packet_id=packet_id)
    requests = [(packet_id, u) for u in flash_requests(sizes.users, random.Random(1))]
    seconds, latencies, answers = await run_grabs(
        lambda p, u: groupbuy_grab(services, p, u), requests
    )
    correct = grade_grabs([(u, a) for _p, u, a in answers], sizes.shares)
    recorded = await services.redis.hlen(services.keys.packet_keys(packet_id)[2])
    correct["sum_ok"] = correct["granted_cents"] == amount and recorded == correct["winners"]
    correct["winners_ok"] = correct["winners"] == sizes.shares
    note = (
        f"1 packet x {sizes.shares} shares, {sizes.users} users + 60% double taps, "
        f"{CONCURRENCY} concurrent; RedPacketService.grab (one EVALSHA)"
    )
    return make_row("flash_grab", "groupbuy", seconds, latencies, correct, note)


async def flash_grab_naive(services: Services, sizes: Sizes, run: str) -> dict[str, Any]:
    """The same load on the SETNX-mutex baseline."""
    naive = NaivePackets(services.redis)
    packet_id, amount = f"flash-{run}", sizes.shares * 100
    shares = [amount // sizes.shares] * sizes.shares
    await naive.create(packet_id, shares)
    requests = [(packet_id, u) for u in flash_requests(sizes.users, random.Random(1))]
    seconds, latencies, answers = await run_grabs(naive.grab, requests)
    correct = grade_grabs([(u, a) for _p, u, a in answers], sizes.shares)
    grabs, left = await naive.state(packet_id)
    correct["sum_ok"] = correct["granted_cents"] + sum(left) == amount
    correct["winners_ok"] = correct["winners"] == sizes.shares
    correct["shares_left"] = len(left)
    correct["too_many_people"] = correct["outcomes"].get("too_many_people", 0)
    note = (
        "naive: SET NX PX 100 mutex per packet, up to 10 tries 1 ms apart, then HEXISTS, "
        "LLEN, LPOP, HSET, DEL (6+ round trips); 'too many people' counted as spurious"
    )
    return make_row("flash_grab", "naive", seconds, latencies, correct, note)


# -- seat locks: snapshots ------------------------------------------------------------


async def groupbuy_snapshot(services: Services, teams: list[tuple[str, str]]) -> tuple[int, int]:
    """One MULTI/EXEC over the teams: (teams over capacity, users holding two locks)."""
    keys = services.keys
    pipe = services.redis.pipeline(transaction=True)
    pipe.time()
    for aid, tid in teams:
        pipe.zrange(keys.team_locks(aid, tid), 0, -1, withscores=True)
        pipe.hmget(keys.team(aid, tid), "member_count", "size", "status", "lock_ttl_ms")
    replies = await pipe.execute()
    seconds, micros = replies[0]
    now_ms = int(seconds) * 1000 + int(micros) // 1000 + services.clock.shift_ms
    holders: Counter[tuple[str, str]] = Counter()
    over = 0
    for index, (aid, _tid) in enumerate(teams):
        locks, (members, size, status, ttl) = replies[1 + 2 * index], replies[2 + 2 * index]
        live = [user for user, score in locks if score + int(ttl) > now_ms]
        holders.update((aid, user) for user in live)
        if status == "open":
            over += int(members) + len(live) > int(size)
        else:
            over += not (status == "formed" and int(members) == int(size) and not live)
    return over, sum(1 for n in holders.values() if n > 1)


async def naive_snapshot(naive: NaiveTeams, teams: list[tuple[str, str]]) -> tuple[int, int]:
    """The same check on the naive keys: members + lockers > size, users in two lockers sets."""
    pipe = naive.redis.pipeline(transaction=True)
    for aid, tid in teams:
        pipe.get(naive.key(aid, tid, "members"))
        pipe.smembers(naive.key(aid, tid, "lockers"))
    replies = await pipe.execute()
    holders: Counter[tuple[str, str]] = Counter()
    over = 0
    for index, (aid, _tid) in enumerate(teams):
        members, lockers = int(replies[2 * index] or 0), replies[2 * index + 1]
        holders.update((aid, user) for user in lockers)
        over += members + len(lockers) > naive.size
    return over, sum(1 for n in holders.values() if n > 1)


class Sampler:
    """Takes snapshots in a loop until stopped; sums the violations it saw."""

    def __init__(self, snapshot: Callable[[], Awaitable[tuple[int, int]]]) -> None:
        self.snapshot = snapshot
        self.samples = self.over_capacity = self.double_locks = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while not self._stop.is_set():
            await self.once()
            await asyncio.sleep(0.005)

    async def once(self) -> None:
        """One snapshot."""
        over, doubled = await self.snapshot()
        self.samples += 1
        self.over_capacity += over
        self.double_locks += doubled

    def start(self) -> None:
        """Begin sampling in the background."""
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> dict[str, int]:
        """Stop, take a last snapshot, and report."""
        self._stop.set()
        if self._task is not None:
            await self._task
        await self.once()
        return {
            "snapshots": self.samples,
            "over_capacity": self.over_capacity,
            "double_locks": self.double_locks,
        }


# -- seat locks: the two implementations behind one small interface --------------------


class GroupbuyTeams:
    """TeamService calls answering a short outcome string."""

    EXPECTED = {"team_full", "team_formed", "team_failed", "already_member"}

    def __init__(self, services: Services) -> None:
        self.teams = services.teams

    async def lock(self, aid: str, tid: str, user: str) -> str:
        try:
            outcome = await self.teams.lock(aid, tid, user)
        except errors.GroupBuyError as exc:
            return exc.code
        if not outcome.created:
            return "existing"
        return "switched" if outcome.body["released_team_id"] else "locked"

    async def unlock(self, aid: str, tid: str, user: str) -> str:
        try:
            return "unlocked" if await self.teams.unlock(aid, tid, user) else "no_lock"
        except errors.GroupBuyError as exc:
            return exc.code

    async def confirm(self, aid: str, tid: str, user: str) -> str:
        try:
            await self.teams.confirm(aid, tid, user, f"o-{user}")
        except errors.GroupBuyError as exc:
            return exc.code
        return "confirmed"


class NaiveTeamsAdapter:
    """NaiveTeams calls answering the same outcome strings."""

    EXPECTED = {"team_full"}

    def __init__(self, naive: NaiveTeams) -> None:
        self.naive = naive

    async def _guard(self, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except TooManyPeople:
            return "too_many_people"

    async def lock(self, aid: str, tid: str, user: str) -> str:
        return str(await self._guard(self.naive.lock(aid, tid, user)))

    async def unlock(self, aid: str, tid: str, user: str) -> str:
        result = await self._guard(self.naive.unlock(aid, tid, user))
        return result if isinstance(result, str) else ("unlocked" if result else "no_lock")

    async def confirm(self, aid: str, tid: str, user: str) -> str:
        return str(await self._guard(self.naive.confirm(aid, tid, user)))


OK_OUTCOMES = {"locked", "switched", "existing", "unlocked", "confirmed"}


class Shopper:
    """One user's seat-lock behaviour: lock 70%, unlock 15%, confirm 15% (of a held lock).

    Without a held lock the user locks. After a confirmed purchase the user is done.
    """

    def __init__(self, engine: Any, meter: Meter, outcomes: Counter[str], rng: random.Random):
        self.engine, self.meter, self.outcomes, self.rng = engine, meter, outcomes, rng
        self.holding: str | None = None
        self.done = False

    async def step(self, aid: str, teams: list[str], user: str) -> None:
        """One operation, measured."""
        roll = self.rng.random()
        engine, held = self.engine, self.holding
        if held and roll >= 0.85:
            result = await self.meter.measure(lambda: engine.confirm(aid, held, user), "confirm")
            self.holding, self.done = None, result == "confirmed"
        elif held and roll >= 0.70:
            result = await self.meter.measure(lambda: engine.unlock(aid, held, user), "unlock")
            self.holding = None
        else:
            tid = self.rng.choice(teams)
            result = await self.meter.measure(lambda: engine.lock(aid, tid, user), "lock")
            if result in ("locked", "switched", "existing"):
                self.holding = tid
        self.outcomes[result] += 1


def storm_correct(
    outcomes: Counter[str], expected: set[str], checks: dict[str, int]
) -> dict[str, Any]:
    """The correctness figures of a lock storm.

    over_capacity and double_locks are violations summed over every MULTI snapshot taken.
    """
    spurious = sum(n for o, n in outcomes.items() if o not in OK_OUTCOMES | expected)
    return {
        "winners": outcomes["confirmed"],
        "over_capacity": checks["over_capacity"],
        "double_locks": checks["double_locks"],
        "duplicates": checks["double_locks"],
        "spurious_failures": spurious,
        "snapshots": checks["snapshots"],
        "outcomes": dict(outcomes),
    }


async def storm(
    engine: Any, aid: str, teams: list[str], sizes: Sizes, sampler: Sampler
) -> tuple[float, Meter, Counter[str]]:
    """Every storm user runs their steps; the sampler checks invariants meanwhile."""
    meter, outcomes, rng = Meter(), Counter[str](), random.Random(7)

    async def user_loop(user: str) -> None:
        shopper = Shopper(engine, meter, outcomes, rng)
        for _ in range(sizes.storm_steps):
            if shopper.done:
                return
            await shopper.step(aid, teams, user)

    sampler.start()
    began = time.perf_counter()
    await asyncio.gather(*(user_loop(f"u{i}") for i in range(sizes.storm_users)))
    return time.perf_counter() - began, meter, outcomes


async def lock_storm_groupbuy(services: Services, sizes: Sizes, run: str) -> dict[str, Any]:
    """T teams of one activity, storm users locking, switching, unlocking, confirming."""
    aid = f"storm-{run}"
    await services.teams.create_activity(aid, team_size=TEAM_SIZE)
    teams = [f"t{i}" for i in range(sizes.teams)]
    await gather_limited(
        [partial(services.teams.open_team, aid, f"lead-{t}", team_id=t) for t in teams]
    )
    pairs = [(aid, t) for t in teams]
    sampler = Sampler(lambda: groupbuy_snapshot(services, pairs))
    seconds, meter, outcomes = await storm(GroupbuyTeams(services), aid, teams, sizes, sampler)
    correct = storm_correct(outcomes, GroupbuyTeams.EXPECTED, await sampler.stop())
    note = (
        f"{sizes.teams} teams of {TEAM_SIZE}, {sizes.storm_users} users x {sizes.storm_steps} "
        f"ops (lock 70/unlock 15/confirm 15), {CONCURRENCY} concurrent; TeamService "
        "(confirm also flushes the outbox to SQLite and reads the team); over_capacity and "
        "double_locks are violations summed over all MULTI snapshots"
    )
    return make_row(
        "lock_storm", "groupbuy", seconds, meter.latencies, correct, note,
        by_operation=meter.breakdown(),
    )  # fmt: skip


async def lock_storm_naive(services: Services, sizes: Sizes, run: str) -> dict[str, Any]:
    """The same storm on the naive mutex-and-counters implementation."""
    aid = f"storm-{run}"
    naive = NaiveTeams(services.redis, TEAM_SIZE)
    teams = [f"t{i}" for i in range(sizes.teams)]
    for tid in teams:
        await naive.open_team(aid, tid)
    pairs = [(aid, t) for t in teams]
    sampler = Sampler(lambda: naive_snapshot(naive, pairs))
    seconds, meter, outcomes = await storm(NaiveTeamsAdapter(naive), aid, teams, sizes, sampler)
    correct = storm_correct(outcomes, NaiveTeamsAdapter.EXPECTED, await sampler.stop())
    correct["too_many_people"] = outcomes["too_many_people"]
    note = (
        "naive: SET NX PX 100 mutex per team (10 tries, 1 ms apart), GET members, GET locked, "
        "INCR, SADD, SET user, DEL; a switch releases the old team afterwards; violations "
        "summed over all MULTI snapshots"
    )
    return make_row(
        "lock_storm", "naive", seconds, meter.latencies, correct, note,
        by_operation=meter.breakdown(),
    )  # fmt: skip


# -- mixed ----------------------------------------------------------------------------

MIXED_ACTIVITIES, MIXED_TEAMS, MIXED_PACKETS, MIXED_SHARES = 20, 10, 50, 100


async def mixed_setup(services: Services, run: str) -> tuple[list[str], list[str], list[str]]:
    """20 activities x 10 teams and 50 packets x 100 shares."""
    activities = [f"mix{i}-{run}" for i in range(MIXED_ACTIVITIES)]
    teams = [f"t{i}" for i in range(MIXED_TEAMS)]
    packets = [f"mixp{i}-{run}" for i in range(MIXED_PACKETS)]
    for aid in activities:
        await services.teams.create_activity(aid, team_size=TEAM_SIZE)
    await gather_limited(
        [
            partial(services.teams.open_team, a, f"lead-{t}", team_id=t)
            for a in activities
            for t in teams
        ]
    )
    sender, amount = f"mixsender-{run}", MIXED_SHARES * 100
    await services.packets.deposit(sender, amount * MIXED_PACKETS, f"mix-{run}")
    for pid in packets:
        await services.packets.send(sender, amount, MIXED_SHARES, packet_id=pid)
    return activities, teams, packets


async def mixed_groupbuy(services: Services, sizes: Sizes, run: str) -> dict[str, Any]:
    """Users each with a home activity: half their operations grab a random packet."""
    activities, teams, packets = await mixed_setup(services, run)
    pairs = [(a, t) for a in activities for t in teams]
    sampler = Sampler(lambda: groupbuy_snapshot(services, pairs))
    engine, meter, outcomes = GroupbuyTeams(services), Meter(), Counter[str]()
    rng = random.Random(11)
    grabs: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)

    async def user_loop(index: int) -> None:
        user, aid = f"u{index}", activities[index % len(activities)]
        shopper = Shopper(engine, meter, outcomes, rng)
        for _ in range(sizes.mixed_steps):
            if rng.random() < 0.5:
                pid = rng.choice(packets)
                answer = await meter.measure(partial(groupbuy_grab, services, pid, user), "grab")
                grabs[pid].append((user, answer))
                outcomes[f"grab:{answer['status']}"] += 1
            elif not shopper.done:
                await shopper.step(aid, teams, user)

    sampler.start()
    began = time.perf_counter()
    await asyncio.gather(*(user_loop(i) for i in range(sizes.mixed_users)))
    seconds = time.perf_counter() - began
    checks = await sampler.stop()
    graded = [grade_grabs(answers, MIXED_SHARES) for answers in grabs.values()]
    expected = GroupbuyTeams.EXPECTED | {"grab:grabbed", "grab:already_grabbed", "grab:sold_out"}
    correct = storm_correct(outcomes, expected, checks)
    correct.update(
        winners=sum(g["winners"] for g in graded),
        grab_duplicates=sum(g["duplicates"] for g in graded),
        grab_over_capacity=sum(g["over_capacity"] for g in graded),
    )
    correct["spurious_failures"] += sum(g["spurious_failures"] for g in graded)
    correct["duplicates"] += correct["grab_duplicates"]
    correct["over_capacity"] += correct["grab_over_capacity"]
    note = (
        f"{MIXED_ACTIVITIES} activities x {MIXED_TEAMS} teams, {MIXED_PACKETS} packets x "
        f"{MIXED_SHARES} shares; {sizes.mixed_users} users x {sizes.mixed_steps} ops, "
        f"half grabs half seat ops, {CONCURRENCY} concurrent"
    )
    return make_row(
        "mixed", "groupbuy", seconds, meter.latencies, correct, note,
        by_operation=meter.breakdown(),
    )  # fmt: skip


# -- redis-benchmark ------------------------------------------------------------------


def redis_benchmark_binary() -> str | None:
    """redis-benchmark on PATH, or Debian's, or None."""
    found = shutil.which("redis-benchmark")
    if found:
        return found
    return "/usr/bin/redis-benchmark" if Path("/usr/bin/redis-benchmark").exists() else None


async def redis_benchmark(
    binary: str, port: int, requests: int, pipeline: int, *cmd: str
) -> dict[str, Any]:
    """Run redis-benchmark -q on one command; its requests/s and p50 (ms)."""
    args = [binary, "-h", "127.0.0.1", "-p", str(port), "-c", "50", "-n", str(requests)]
    args += ["-r", "100000000", "-P", str(pipeline), "-q", *cmd]
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    text = out.decode(errors="replace") + err.decode(errors="replace")
    rates = re.findall(r"([\d.]+) requests per second", text)
    p50 = re.findall(r"p50=([\d.]+) msec", text)
    if process.returncode != 0 or not rates:
        raise RuntimeError(f"redis-benchmark failed: {text.strip()[-300:]}")
    return {"rps": float(rates[-1]), "p50_ms": float(p50[-1]) if p50 else None}


async def prepare_bench_packet(services: Services, packet_id: str, shares: int) -> None:
    """A packet of `shares` one-cent shares, straight through packet_create."""
    now = await services.clock.now_ms(services.redis)
    await services.scripts.call(
        "packet_create",
        services.keys.packet_keys(packet_id),
        [packet_id, 0, "bench", shares, shares, "equal", now, now + 3_600_000, 60_000]
        + [1] * shares,
    )


async def prepare_bench_team(services: Services, aid: str, tid: str) -> None:
    """An activity with a huge team size and one open team of it (Redis only)."""
    keys = services.keys
    await services.redis.hset(
        keys.activity(aid),
        mapping={"team_size": 10**9, "lock_ttl_ms": 3_600_000, "team_deadline_ms": 86_400_000},
    )
    await services.scripts.call(
        "team_open", [*keys.team_keys(aid, tid), keys.activity(aid)], [aid, tid, 0, "lead", "", 0]
    )


def bench_row(
    script: str, pipeline: int, requests: int, result: dict[str, Any], winners: int
) -> dict[str, Any]:
    """A redis-benchmark result as a row (only p50 is known)."""
    rps = result["rps"]
    row = {
        "scenario": f"evalsha_{script}",
        "level": "redis-benchmark",
        "implementation": "redis-benchmark evalsha",
        "ops": requests,
        "seconds": round(requests / rps, 4),
        "ops_per_s": rps,
        "p50_ms": result["p50_ms"],
        "p95_ms": None,
        "p99_ms": None,
        "correct": {"winners": winners, "over_capacity": 0, "duplicates": 0},
        "latencies_ms": [],
        "note": f"redis-benchmark -c 50 -n {requests} -P {pipeline}: EVALSHA of "
        f"lua/{'packet_grab' if script == 'grab' else 'team_lock'}.lua, a new user each call",
        "pipeline": pipeline,
    }
    say(f"evalsha_{script:<5} -P {pipeline:<2} {rps:>10,.0f} req/s  p50 {result['p50_ms']} ms")
    return row


async def redis_benchmark_rows(
    services: Services, redis_url: str, sizes: Sizes
) -> list[dict[str, Any]]:
    """The grab and lock scripts under redis-benchmark, plain and with -P 16."""
    binary = redis_benchmark_binary()
    if binary is None:
        say("redis-benchmark not found: skipped")
        return []
    port = urlparse(redis_url).port or 6379
    redis, keys, n = services.redis, services.keys, sizes.bench_requests
    grab_sha = await redis.script_load(script_source("packet_grab"))
    lock_sha = await redis.script_load(script_source("team_lock"))
    rows = []
    for pipeline in (1, 16):
        pid = f"rb{pipeline}"
        await prepare_bench_packet(services, pid, n + n // 5)
        cmd = ["EVALSHA", grab_sha, "4", *keys.packet_keys(pid), pid, "0", "user:__rand_int__"]
        result = await redis_benchmark(binary, port, n, pipeline, *cmd)
        winners = await redis.hlen(keys.packet_keys(pid)[2])
        rows.append(bench_row("grab", pipeline, n, result, winners))
    for pipeline in (1, 16):
        aid, tid = f"rb{pipeline}", "t0"
        await prepare_bench_team(services, aid, tid)
        user_key = keys.user_lock(aid, "__rand_int__")
        cmd = ["EVALSHA", lock_sha, "7", *keys.team_keys(aid, tid), user_key]
        cmd += [aid, tid, "0", "user:__rand_int__", ""]
        result = await redis_benchmark(binary, port, n, pipeline, *cmd)
        winners = await redis.zcard(keys.team_locks(aid, tid))
        rows.append(bench_row("lock", pipeline, n, result, winners))
    return rows


# -- scaling --------------------------------------------------------------------------

SCALING_SHARES, SCALING_TEAM_SIZE, BATCH = 10, 50, 2000


async def create_packets_pipelined(services: Services, count: int) -> list[str]:
    """`count` small packets through packet_create, pipelined in batches."""
    sha = await services.redis.script_load(script_source("packet_create"))
    now = await services.clock.now_ms(services.redis)
    shares = [10] * SCALING_SHARES  # 10 cents each
    ids = [f"s{i}" for i in range(count)]

    async def batch(start: int) -> None:
        pipe = services.redis.pipeline(transaction=False)
        for pid in ids[start : start + BATCH]:
            args = [pid, 0, "bench", sum(shares), SCALING_SHARES, "equal", now]
            args += [now + 3_600_000, 60_000, *shares]
            pipe.evalsha(sha, 4, *services.keys.packet_keys(pid), *args)
        await pipe.execute()

    await gather_limited([partial(batch, s) for s in range(0, count, BATCH)], limit=3)
    return ids


async def create_teams_pipelined(services: Services, aid: str, count: int) -> list[str]:
    """`count` open teams of one activity through team_open, pipelined in batches."""
    keys = services.keys
    await services.teams.create_activity(aid, team_size=SCALING_TEAM_SIZE)
    sha = await services.redis.script_load(script_source("team_open"))
    ids = [f"t{i}" for i in range(count)]

    async def batch(start: int) -> None:
        pipe = services.redis.pipeline(transaction=False)
        for tid in ids[start : start + BATCH]:
            team_keys = [*keys.team_keys(aid, tid), keys.activity(aid)]
            pipe.evalsha(sha, 7, *team_keys, aid, tid, 0, f"lead-{tid}", "", 60_000)
        await pipe.execute()

    await gather_limited([partial(batch, s) for s in range(0, count, BATCH)], limit=3)
    return ids


async def scaling_grabs(services: Services, live: int, sizes: Sizes) -> dict[str, Any]:
    """Grab rate on random packets among `live` live ones; bytes per packet and per grab."""
    redis = services.redis
    await redis.flushall()
    before = await used_memory(redis)
    began = time.perf_counter()
    ids = await create_packets_pipelined(services, live)
    create_s = time.perf_counter() - began
    created = await used_memory(redis)
    rng = random.Random(live)
    requests = [(rng.choice(ids), f"g{i}") for i in range(sizes.scaling_ops)]
    seconds, latencies, answers = await run_grabs(
        lambda p, u: groupbuy_grab(services, p, u), requests
    )
    after = await used_memory(redis)
    statuses = Counter(a["status"] for _p, _u, a in answers)
    grabbed = statuses["grabbed"]
    memory = {
        "bytes_per_live_packet": round((created - before) / live, 1),
        "bytes_per_grab": round((after - created) / max(grabbed, 1), 1),
    }
    correct = {
        "winners": grabbed,
        "over_capacity": 0,
        "duplicates": 0,
        "spurious_failures": statuses.total() - grabbed - statuses["sold_out"],
        "outcomes": dict(statuses),
    }
    note = (
        f"grab on random packets among {live:,} live ({SCALING_SHARES} shares each, created "
        f"in {create_s:.2f} s pipelined); {memory['bytes_per_live_packet']:.0f} B/packet, "
        f"{memory['bytes_per_grab']:.0f} B/grab (incl. its outbox entry; a packet's first grab "
        "also creates its grabs hash and first stream node, so sparse grabs cost more)"
    )
    return make_row(
        "scaling", "groupbuy", seconds, latencies, correct, note,
        operation="grab", live=live, memory=memory,
    )  # fmt: skip


async def scaling_locks(services: Services, live: int, sizes: Sizes, run: str) -> dict[str, Any]:
    """Lock rate on random teams among `live` open ones; bytes per team and per lock."""
    redis = services.redis
    await redis.flushall()
    aid = f"scale{live}-{run}"
    before = await used_memory(redis)
    began = time.perf_counter()
    ids = await create_teams_pipelined(services, aid, live)
    create_s = time.perf_counter() - began
    created = await used_memory(redis)
    engine, meter, rng = GroupbuyTeams(services), Meter(), random.Random(live)
    calls = [(rng.choice(ids), f"l{i}") for i in range(sizes.scaling_ops)]
    began = time.perf_counter()
    results = await asyncio.gather(
        *(meter.measure(partial(engine.lock, aid, t, u)) for t, u in calls)
    )
    seconds = time.perf_counter() - began
    after = await used_memory(redis)
    statuses = Counter(results)
    locked = statuses["locked"]
    memory = {
        "bytes_per_live_team": round((created - before) / live, 1),
        "bytes_per_lock": round((after - created) / max(locked, 1), 1),
    }
    correct = {
        "winners": locked,
        "over_capacity": 0,
        "duplicates": 0,
        "spurious_failures": statuses.total() - locked,
        "outcomes": dict(statuses),
    }
    note = (
        f"lock on random teams among {live:,} open (size {SCALING_TEAM_SIZE}, created in "
        f"{create_s:.2f} s pipelined), a new user each; "
        f"{memory['bytes_per_live_team']:.0f} B/team, {memory['bytes_per_lock']:.0f} B/lock"
    )
    return make_row(
        "scaling", "groupbuy", seconds, meter.latencies, correct, note,
        operation="lock", live=live, memory=memory,
    )  # fmt: skip


# -- entry point ----------------------------------------------------------------------


# -- latency at half the maximum rate ---------------------------------------------------


async def open_loop(
    call: Callable[[int], Awaitable[Any]], rate: float, seconds: float
) -> list[float]:
    """Issue call(i) at a fixed rate whatever the answers do (an open loop) and return each
    latency measured from the moment it was due, so waiting in a queue counts too."""
    total = max(1, int(rate * seconds))
    latencies: list[float] = []
    tasks = []

    async def one(i: int, due: float) -> None:
        await call(i)
        latencies.append(time.perf_counter() - due)

    start = time.perf_counter()
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    return latencies


async def half_rate(
    services: Services, kind: str, max_rate: float, sizes: Sizes, run: str
) -> dict[str, Any]:
    """p50/p95/p99 of grabs or locks offered at half the rate measured earlier in this run."""
    rate = max_rate / 2
    seconds = 2.0 if sizes is QUICK else 5.0
    total = max(1, int(rate * seconds))
    if kind == "grab":
        # enough packets of at most 5,000 shares (the config caps a packet at 10,000)
        packets = [f"half-{run}-{p}" for p in range(total // 5000 + 1)]
        await services.packets.deposit(f"hs-{run}", len(packets) * 10_000, f"half-{run}")
        for packet_id in packets:
            await services.packets.send(f"hs-{run}", 10_000, 5000, packet_id=packet_id)

        async def call(i: int) -> Any:
            return await groupbuy_grab(services, packets[i % len(packets)], f"h{i}")
    else:
        aid = f"half-{run}"
        await services.teams.create_activity(aid, team_size=50)
        teams = [f"t{t}" for t in range(max(1, total // 40 + 1))]
        await gather_limited(
            [partial(services.teams.open_team, aid, f"L{t}", team_id=t) for t in teams]
        )

        async def call(i: int) -> Any:
            try:
                return await services.teams.lock(aid, teams[i % len(teams)], f"h{i}")
            except errors.GroupBuyError as exc:
                return exc.code

    latencies = await open_loop(call, rate, seconds)
    note = (
        f"{kind}s offered at {rate:,.0f}/s (half of the {max_rate:,.0f}/s measured above) "
        f"for {seconds:.0f} s, open loop; latency from when each call was due"
    )
    return make_row(f"{kind} @ half max rate", "groupbuy", seconds, latencies, {}, note)


def _rate_of(rows: list[dict[str, Any]], scenario: str, note_part: str = "") -> float:
    for row in rows:
        if (
            row["scenario"] == scenario
            and row["implementation"] == "groupbuy"
            and note_part in row.get("note", "")
        ):
            return float(row["ops_per_s"])
    return 1000.0


async def warm_up(services: Services) -> None:
    """Open the client's connections before measuring (a running service has them)."""
    await asyncio.gather(*(services.redis.ping() for _ in range(CONCURRENCY * 2)))


async def open_services(redis_url: str, database_url: str) -> Services:
    """The production wiring on the given Redis and SQLite file, tables created, scripts loaded."""
    settings = Settings().replace("redis", url=redis_url, max_connections=512)
    settings = settings.replace("database", url=database_url)
    database = Database(database_url)
    await database.create_all()
    services = build_services(settings, redis=connect_redis(settings.redis), database=database)
    await services.scripts.load()
    settle_heap()  # as the service does at the end of its start-up
    return services


async def run_engine(redis_url: str, database_url: str, quick: bool) -> list[dict[str, Any]]:
    """Run every engine-level scenario; one dict per measured row."""
    sizes = QUICK if quick else FULL
    run = secrets.token_hex(3)  # ids unique in a reused SQLite file
    services = await open_services(redis_url, database_url)
    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    try:
        steps: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("flash_grab groupbuy", lambda: flash_grab_groupbuy(services, sizes, run)),
            ("flash_grab naive", lambda: flash_grab_naive(services, sizes, run)),
            ("lock_storm groupbuy", lambda: lock_storm_groupbuy(services, sizes, run)),
            ("lock_storm naive", lambda: lock_storm_naive(services, sizes, run)),
            ("mixed groupbuy", lambda: mixed_groupbuy(services, sizes, run)),
            ("redis-benchmark", lambda: redis_benchmark_rows(services, redis_url, sizes)),
        ]
        for live in sizes.scaling_live:
            steps.append((f"scaling grab {live}", partial(scaling_grabs, services, live, sizes)))
            steps.append(
                (f"scaling lock {live}", partial(scaling_locks, services, live, sizes, run))
            )
        steps.append(
            (
                "grab at half the max rate",
                lambda: half_rate(services, "grab", _rate_of(rows, "flash_grab"), sizes, run),
            )
        )
        steps.append(
            (
                "lock at half the max rate",
                lambda: half_rate(
                    services, "lock", _rate_of(rows, "scaling", "lock on random teams"), sizes, run
                ),
            )
        )
        for name, step in steps:
            await services.redis.flushall()
            await warm_up(services)
            say(f"{name} ... ({time.perf_counter() - began:.1f} s so far)")
            result = await step()
            rows.extend(result if isinstance(result, list) else [result])
    finally:
        await services.redis.flushall()
        await services.redis.aclose()
        await services.database.dispose()
    say(f"done in {time.perf_counter() - began:.1f} s, {len(rows)} rows")
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """The key numbers of each row."""
    print(f"{'scenario':<13}{'impl':<25}{'ops':>8}{'ops/s':>11}{'p50':>8}{'p99':>8}  correct")
    for r in rows:
        keys = ("winners", "over_capacity", "duplicates", "double_locks", "spurious_failures")
        correct = {k: r["correct"][k] for k in keys if k in r["correct"]}
        extra = f" live={r['live']} {r['operation']} {r['memory']}" if "live" in r else ""
        extra += f" {r['by_operation']}" if "by_operation" in r else ""
        print(
            f"{r['scenario']:<13}{r['implementation']:<25}{r['ops']:>8}{r['ops_per_s']:>11,.0f}"
            f"{r['p50_ms'] or 0:>8.2f}{r['p99_ms'] or 0:>8.2f}  {correct}{extra}"
        )


def main() -> None:
    """Start a private redis-server, run the quick (or --full) engine benchmark, print rows."""
    from groupbuy.testing.servers import start_redis

    server = start_redis()
    directory = Path(tempfile.mkdtemp(prefix="groupbuy-bench-"))
    try:
        url = f"sqlite+aiosqlite:///{directory / 'bench.db'}"
        rows = asyncio.run(run_engine(server.url, url, quick="--full" not in sys.argv))
        print_table(rows)
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
