"""What every engine scenario shares: sizes, grading, the grab call, the flash requests."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import harness
from benchmarks.harness import CONCURRENCY, Meter
from groupbuy import errors
from groupbuy.services import Services

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
    harness.say(message, "engine")


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


async def run_grabs(
    grab: Callable[[str, str], Awaitable[dict[str, Any]]],
    requests: list[tuple[str, str]],
    concurrency: int = CONCURRENCY,
) -> tuple[float, list[float], list[tuple[str, str, dict[str, Any]]]]:
    """(packet, user) requests, `concurrency` at once: seconds, latencies, answers."""
    meter = Meter(concurrency)
    answers: list[tuple[str, str, dict[str, Any]]] = []

    async def one(packet_id: str, user: str) -> None:
        answers.append((packet_id, user, await meter.measure(lambda: grab(packet_id, user))))

    began = time.perf_counter()
    await asyncio.gather(*(one(p, u) for p, u in requests))
    return time.perf_counter() - began, meter.latencies, answers
