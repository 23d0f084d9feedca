"""The closed-loop storms: flash grab, lock storm, join flash (docs/benchmarking.md says
how); they guard the grab, the seat lock, the confirm and the join against overselling and
spurious refusals under concurrency.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from benchmarks.engine.common import (
    TEAM_SIZE,
    GroupbuyTeams,
    Sizes,
    flash_requests,
    grade_grabs,
    open_teams,
    run_grabs,
)
from benchmarks.harness import CONCURRENCY, Meter, Row, make_row
from groupbuy import errors
from groupbuy.services import Services
from tests.support.joins import Tap, grade_joins
from tests.support.seats import read_seats

T = TypeVar("T")
OK_OUTCOMES = {"locked", "switched", "existing", "unlocked", "confirmed"}
JOIN_TEAM_SIZE = 3


# -- flash grab ---------------------------------------------------------------------------


async def flash_grab(services: Services, sizes: Sizes, run: str) -> Row:
    """One packet of K shares, U users plus double taps, through RedPacketService.grab."""
    packet_id, amount = f"flash-{run}", sizes.shares * 100
    requests = [(packet_id, u) for u in flash_requests(sizes.users, random.Random(1))]
    await services.packets.accounts.deposit(f"sender-{run}", amount, f"flash-{run}")
    await services.packets.sending.send(f"sender-{run}", amount, sizes.shares, packet_id=packet_id)
    seconds, latencies, answers = await run_grabs(services, requests)
    correct = grade_grabs([(u, a) for _p, u, a in answers], sizes.shares)
    recorded = await services.redis.hlen(services.keys.packet_keys(packet_id).grabs)
    correct["sum_ok"] = correct["granted_cents"] == amount and recorded == correct["winners"]
    correct["winners_ok"] = correct["winners"] == sizes.shares
    note = f"{sizes.shares} shares, {sizes.users} users"
    return make_row("flash_grab", "groupbuy", seconds, latencies, correct, note)


# -- lock storm ---------------------------------------------------------------------------


async def groupbuy_snapshot(services: Services, teams: list[tuple[str, str]]) -> tuple[int, int]:
    """One instant of the teams (one script, so it also runs on Redis Cluster): (teams over
    capacity, users holding two locks). The teams are of one activity."""
    now_ms, replies = await read_seats(
        services.redis, services.keys, services.clock.shift_ms, teams
    )
    holders: Counter[tuple[str, str]] = Counter()
    over = 0
    for index, (aid, _tid) in enumerate(teams):
        locks, (members, size, status, ttl) = replies[2 * index], replies[2 * index + 1]
        live = [user for user, score in locks if score + int(ttl) > now_ms]
        holders.update((aid, user) for user in live)
        if status == "open":
            over += int(members) + len(live) > int(size)
        else:
            over += not (status == "formed" and int(members) == int(size) and not live)
    return over, sum(1 for n in holders.values() if n > 1)


async def sample(
    snapshot: Callable[[], Awaitable[tuple[int, int]]], load: Awaitable[T]
) -> tuple[dict[str, int], T]:
    """Snapshots in a loop while `load` runs, and one after it: violations summed, and
    what the load returned."""
    found = {"snapshots": 0, "over_capacity": 0, "double_locks": 0}
    task = asyncio.ensure_future(load)

    async def once() -> None:
        over, doubled = await snapshot()
        found["snapshots"] += 1
        found["over_capacity"] += over
        found["double_locks"] += doubled

    while not task.done():
        await once()
        await asyncio.sleep(0.005)
    result = await task
    await once()
    return found, result


async def storm(
    engine: GroupbuyTeams, aid: str, teams: list[str], sizes: Sizes
) -> tuple[Meter, Counter[str]]:
    """Every storm user's steps: lock 70%, unlock 15%, confirm 15% (of a held lock); a user
    holding nothing locks; a confirmed user is done."""
    meter, outcomes, rng = Meter(), Counter[str](), random.Random(7)

    async def user_loop(user: str) -> None:
        held: str | None = None
        for _ in range(sizes.storm_steps):
            roll = rng.random()
            if held and roll >= 0.85:
                result = await meter.measure(partial(engine.confirm, aid, held, user), "confirm")
                held = None
            elif held and roll >= 0.70:
                result = await meter.measure(partial(engine.unlock, aid, held, user), "unlock")
                held = None
            else:
                tid = rng.choice(teams)
                result = await meter.measure(partial(engine.lock, aid, tid, user), "lock")
                held = tid if result in ("locked", "switched", "existing") else held
            outcomes[result] += 1
            if result == "confirmed":
                return

    await asyncio.gather(*(user_loop(f"u{i}") for i in range(sizes.storm_users)))
    return meter, outcomes


async def lock_storm(services: Services, sizes: Sizes, run: str) -> Row:
    """T teams of one activity, storm users locking, switching, unlocking, confirming."""
    aid, teams = f"storm-{run}", [f"t{i}" for i in range(sizes.teams)]
    await open_teams(services, aid, teams, TEAM_SIZE)
    engine = GroupbuyTeams(services)
    snapshot = partial(groupbuy_snapshot, services, [(aid, t) for t in teams])
    began = time.perf_counter()
    checks, (meter, outcomes) = await sample(snapshot, storm(engine, aid, teams, sizes))
    seconds = time.perf_counter() - began
    spurious = sum(n for o, n in outcomes.items() if o not in OK_OUTCOMES | engine.EXPECTED)
    correct = {"winners": outcomes["confirmed"], "over_capacity": checks["over_capacity"],
               "double_locks": checks["double_locks"], "duplicates": checks["double_locks"],
               "spurious_failures": spurious, "snapshots": checks["snapshots"],
               "outcomes": dict(outcomes)}  # fmt: skip
    note = f"{sizes.teams} teams, {sizes.storm_users} users x {sizes.storm_steps} ops"
    return make_row("lock_storm", "groupbuy", seconds, meter.latencies, correct, note,
                    by_operation=meter.breakdown())  # fmt: skip


# -- join flash ---------------------------------------------------------------------------


async def join_flash(services: Services, sizes: Sizes, run: str) -> Row:
    """T teams of 3 with their leader, U shoppers each joining once through SeatService.join."""
    aid, team_ids = f"join-{run}", [f"t{i}" for i in range(sizes.join_teams)]
    await open_teams(services, aid, team_ids, JOIN_TEAM_SIZE)
    free = sizes.join_teams * (JOIN_TEAM_SIZE - 1)
    meter, taps = Meter(CONCURRENCY), list[Tap]()

    async def join(user: str) -> Any:
        try:
            return await services.teams.seats.join(aid, user)
        except errors.GroupBuyError as exc:
            return exc.code

    async def shopper(user: str) -> None:
        began = time.perf_counter()
        answer = await meter.measure(partial(join, user))
        ended = time.perf_counter()
        if isinstance(answer, str):
            taps.append(Tap(user, answer, None, began, ended))
        else:
            outcome = "locked" if answer.created else "existing"
            taps.append(Tap(user, outcome, answer.body["team_id"], began, ended))

    began = time.perf_counter()
    await asyncio.gather(*(shopper(f"u{i}") for i in range(sizes.join_users)))
    seconds = time.perf_counter() - began
    correct = grade_joins(taps, free, JOIN_TEAM_SIZE - 1)
    over, doubled = await groupbuy_snapshot(services, [(aid, t) for t in team_ids])
    correct["over_capacity"] += over  # what Redis holds at the end, checked atomically
    correct["double_locks"] = doubled
    correct["winners_ok"] = correct["winners"] == min(free, sizes.join_users)
    note = f"{sizes.join_teams} teams ({free} free seats), {sizes.join_users} shoppers"
    return make_row("join_flash", "groupbuy", seconds, meter.latencies, correct, note)
