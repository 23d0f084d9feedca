"""What every engine scenario shares: sizes, progress lines, rows, the services, grading."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.measure import CONCURRENCY, Row, percentile, result_row
from groupbuy import errors, migrations
from groupbuy.services import Services, build_services, settle_heap
from groupbuy.settings import Settings
from groupbuy.storage.db import Database
from groupbuy.storage.redis_client import connect_redis

LATENCY_SAMPLE = 2000  # latencies kept per row for the plot
TEAM_SIZE = 5


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is (full run or quick run)."""

    shares: int  # K, shares of the flash packet
    users: int  # U, users of the flash grab
    teams: int  # T, teams of the lock storm
    storm_users: int
    storm_steps: int
    bench_requests: int  # redis-benchmark -n
    scaling_live: tuple[int, ...]
    scaling_ops: int
    versus_rounds: int  # interleaved rounds (benchmarks/engine/versus.py), after a warm-up
    versus_shares: int  # shares of each round's flash packet
    versus_users: int  # users of each round's flash grab (+60% double taps)
    versus_teams: int  # teams of each round's seat locks (twice as many users as seats)
    versus_fresh: int  # grabs by new users per round, against redis-benchmark
    versus_bench_requests: int  # redis-benchmark -n per round
    join_teams: int  # open teams of 3 of the join flash (two free seats each)
    join_users: int  # shoppers of the join flash, each tapping once


FULL = Sizes(
    1000, 5000, 200, 2000, 10, 200_000, (10**3, 10**4, 10**5), 5_000,
    5, 1000, 3000, 250, 5000, 50_000, 1000, 5000,
)  # fmt: skip
QUICK = Sizes(
    200, 1000, 50, 300, 10, 25_000, (10**3, 10**4), 3_000,
    3, 300, 1000, 100, 2000, 20_000, 200, 1000,
)  # fmt: skip


def say(message: str) -> None:
    """One progress line."""
    print(f"[engine] {message}", flush=True)


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
) -> Row:
    """One engine row (benchmarks.measure.result_row) from measured latencies, announced."""
    ops = len(latencies) if ops is None else ops
    ordered = sorted(latencies)
    sample = ordered if len(ordered) <= LATENCY_SAMPLE else random.sample(ordered, LATENCY_SAMPLE)
    row = result_row(
        scenario,
        level,
        implementation,
        ops,
        seconds,
        (percentile(ordered, 0.50), percentile(ordered, 0.95), percentile(ordered, 0.99)),
        correct,
        note,
        latencies_ms=[round(s * 1000, 3) for s in sample],
        **extra,
    )
    say(
        f"{scenario:<12} {implementation:<24} {row['ops_per_s']:>10,.0f} ops/s  "
        f"p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  {correct}"
    )
    return row


async def used_memory(redis: Any) -> int:
    """Redis's used_memory in bytes."""
    return int((await redis.info("memory"))["used_memory"])


def grade_grabs(
    outcomes: list[tuple[str, dict[str, Any]]], count: int, repeat_amount: bool = True
) -> dict[str, Any]:
    """Winners, duplicates and spurious failures of one packet's grab answers.

    Spurious: a non-winner refused with anything but sold_out, or a winner's other
    answer not `already_grabbed` with the same amount (any `already_grabbed` when the
    implementation does not repeat the amount: `repeat_amount` false).
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
                if repeat_amount:
                    same = same and answer.get("amount_cents") == amounts[0]
                spurious += not same
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
        return await services.packets.grabs.grab(packet_id, user)
    except errors.GroupBuyError as exc:
        return {"status": exc.code}


async def warm_up(services: Services) -> None:
    """Open the client's connections before measuring (a running service has them)."""
    await asyncio.gather(*(services.redis.ping() for _ in range(CONCURRENCY * 2)))


@contextlib.contextmanager
def private_redis_and_sqlite() -> Iterator[tuple[str, str]]:
    """(Redis URL, SQLite URL) of a redis-server started on a free port and a SQLite file in
    a temporary directory, both gone at the end: what a benchmark run alone stands on."""
    from tests.support.servers import start_redis

    server = start_redis()
    directory = Path(tempfile.mkdtemp(prefix="groupbuy-bench-"))
    try:
        yield server.url, f"sqlite+aiosqlite:///{directory / 'bench.db'}"
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


async def open_services(
    redis_url: str, database_url: str, auto_pipeline: bool = True, **redis: Any
) -> Services:
    """The production wiring on the given Redis and database, the schema migrated, scripts
    loaded; script calls coalesced ([redis] auto_pipeline, the default) or not; `redis`:
    other [redis] settings (e.g. cluster=True)."""
    settings = Settings().replace(
        "redis", url=redis_url, max_connections=512, auto_pipeline=auto_pipeline, **redis
    )
    settings = settings.replace("database", url=database_url)
    database = Database(database_url)
    await migrations.upgrade(database)
    services = build_services(settings, redis=connect_redis(settings.redis), database=database)
    await services.scripts.load()
    settle_heap()  # as the service does at the end of its start-up
    return services


async def close_services(services: Services) -> None:
    """Let coalesced batches finish, then close the Redis client and the database."""
    await services.scripts.aclose()
    await services.redis.aclose()
    await services.database.dispose()
