"""What every engine scenario shares: sizes, grading, the calls, the set-up in bulk."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from benchmarks import harness
from benchmarks.harness import CONCURRENCY, Meter, gather_limited
from groupbuy import errors
from groupbuy.redpacket.send import PACKET_CREATE
from groupbuy.services import Services
from groupbuy.storage.specs import script_source

TEAM_SIZE = 5
BATCH = 2000  # script calls per pipeline when creating live packets in bulk


@dataclass(frozen=True)
class Sizes:
    """How big each scenario is (full run or quick run)."""

    shares: int  # K, shares of the flash packet
    users: int  # U, users of the flash grab
    teams: int  # T, teams of the lock storm
    storm_users: int
    storm_steps: int
    scaling_live: tuple[int, ...]
    scaling_ops: int
    versus_rounds: int  # interleaved rounds (benchmarks/engine/versus.py), after a warm-up
    versus_shares: int  # shares of each round's flash packet
    versus_users: int  # users of each round's flash grab (+60% double taps)
    versus_teams: int  # teams of each round's seat locks (twice as many users as seats)
    join_teams: int  # open teams of 3 of the join flash (two free seats each)
    join_users: int  # shoppers of the join flash, each tapping once


FULL = Sizes(1000, 5000, 200, 2000, 10, (10**3, 10**4, 10**5), 5_000,
             5, 1000, 3000, 250, 1000, 5000)  # fmt: skip
QUICK = Sizes(200, 1000, 50, 300, 10, (10**3, 10**4), 3_000,
              3, 300, 1000, 100, 200, 1000)  # fmt: skip


def say(message: str) -> None:
    """One progress line."""
    harness.say(message, "engine")


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
    return {"winners": winners, "over_capacity": max(0, winners - count),
            "duplicates": duplicates, "spurious_failures": spurious, "granted_cents": total,
            "outcomes": dict(statuses)}  # fmt: skip


def flash_requests(users: int, rng: random.Random) -> list[str]:
    """Every user once, 60% of them a second time (double taps), shuffled."""
    ids = [f"u{i}" for i in range(users)]
    requests = ids + rng.sample(ids, int(users * 0.6))
    rng.shuffle(requests)
    return requests


async def groupbuy_grab(services: Services, packet_id: str, user: str) -> dict[str, Any]:
    """The service's grab, with errors turned into a status."""
    try:
        return dict(await services.packets.grabs.grab(packet_id, user))
    except errors.GroupBuyError as exc:
        return {"status": exc.code}


async def run_calls(
    call: Callable[[str, str], Awaitable[Any]],
    requests: Sequence[tuple[str, str]],
    concurrency: int = CONCURRENCY,
) -> tuple[float, list[float], list[tuple[str, str, Any]]]:
    """call(a, b) for every (a, b) request, `concurrency` at once: seconds, latencies and
    (a, b, answer) in the order the answers came."""
    meter = Meter(concurrency)
    answers: list[tuple[str, str, Any]] = []

    async def one(a: str, b: str) -> None:
        answers.append((a, b, await meter.measure(lambda: call(a, b))))

    began = time.perf_counter()
    await asyncio.gather(*(one(a, b) for a, b in requests))
    return time.perf_counter() - began, meter.latencies, answers


async def run_grabs(
    services: Services, requests: Sequence[tuple[str, str]], concurrency: int = CONCURRENCY
) -> tuple[float, list[float], list[tuple[str, str, Any]]]:
    """(packet, user) grabs through the service (run_calls)."""
    return await run_calls(partial(groupbuy_grab, services), requests, concurrency)


class GroupbuyTeams:
    """The team engine's seat calls answering a short outcome string."""

    EXPECTED = {"team_full", "team_formed", "team_failed", "already_member"}

    def __init__(self, services: Services) -> None:
        self.seats = services.teams.seats

    async def _code(self, call: Awaitable[Any], done: Callable[[Any], str]) -> str:
        try:
            return done(await call)
        except errors.GroupBuyError as exc:
            return exc.code

    async def lock(self, aid: str, tid: str, user: str) -> str:
        def named(outcome: Any) -> str:
            if not outcome.created:
                return "existing"
            return "switched" if outcome.body["released_team_id"] else "locked"

        return await self._code(self.seats.lock(aid, tid, user), named)

    async def unlock(self, aid: str, tid: str, user: str) -> str:
        call = self.seats.unlock(aid, tid, user)
        return await self._code(call, lambda held: "unlocked" if held else "no_lock")

    async def confirm(self, aid: str, tid: str, user: str) -> str:
        call = self.seats.confirm(aid, tid, user, f"o-{user}")
        return await self._code(call, lambda _o: "confirmed")


async def open_teams(services: Services, aid: str, teams: list[str], size: int) -> None:
    """An activity of `size` with the teams open, each led by lead-<team>."""
    activities = services.teams.activities
    await activities.create_activity(aid, team_size=size)
    await gather_limited(
        [partial(activities.open_team, aid, f"lead-{t}", team_id=t) for t in teams]
    )


async def pipelined(
    services: Services, script: str, calls: list[tuple[list[str], list[Any]]]
) -> None:
    """One script over many (keys, args), pipelined in batches (Redis only: no SQL row)."""
    sha = await services.redis.script_load(script_source(script))

    async def batch(start: int) -> None:
        pipe = services.redis.pipeline(transaction=False)
        for keys, args in calls[start : start + BATCH]:
            pipe.evalsha(sha, len(keys), *keys, *args)
        await pipe.execute()

    await gather_limited([partial(batch, s) for s in range(0, len(calls), BATCH)], limit=3)


async def create_packets(services: Services, ids: list[str], shares: int, sender: str) -> None:
    """Live packets of `shares` 10-cent shares straight through packet_create (pipelined)."""
    now = await services.clock.now_ms(services.redis)
    # A plain packet: anyone may grab, no greeting, password or commitment.
    recorded = {"shift_ms": 0, "sender_id": sender, "amount_cents": 10 * shares,
                "count": shares, "strategy": "equal", "created_ms": now,
                "expires_ms": now + 3_600_000, "retention_ms": 60_000, "recipients_count": 0,
                **dict.fromkeys(("message", "shares_sha256", "gate", "pw_salt", "pw_hash"), ""),
                }  # fmt: skip
    calls = [
        (PACKET_CREATE.key_list(services.keys.packet_keys(pid)),
         PACKET_CREATE.arg_list({"packet_id": pid, **recorded}, [10] * shares))
        for pid in ids
    ]  # fmt: skip
    await pipelined(services, "packet_create", calls)


async def used_memory(redis: Any) -> int:
    """Redis's used_memory in bytes."""
    return int((await redis.info("memory"))["used_memory"])
