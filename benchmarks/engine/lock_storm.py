"""lock_storm: users lock, switch, unlock and confirm seats in one activity's teams while
snapshots (one script each) check that no team is over-filled and nobody holds two locks;
groupbuy against the naive baseline."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from benchmarks.engine.common import TEAM_SIZE, Sizes
from benchmarks.harness import CONCURRENCY, Meter, gather_limited, make_row
from benchmarks.naive import NaiveTeams, TooManyPeople
from groupbuy import errors
from groupbuy.services import Services
from tests.support.seats import read_seats

OK_OUTCOMES = {"locked", "switched", "existing", "unlocked", "confirmed"}


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


class GroupbuyTeams:
    """The team engine's seat calls answering a short outcome string."""

    EXPECTED = {"team_full", "team_formed", "team_failed", "already_member"}

    def __init__(self, services: Services) -> None:
        self.teams = services.teams

    async def lock(self, aid: str, tid: str, user: str) -> str:
        try:
            outcome = await self.teams.seats.lock(aid, tid, user)
        except errors.GroupBuyError as exc:
            return exc.code
        if not outcome.created:
            return "existing"
        return "switched" if outcome.body["released_team_id"] else "locked"

    async def unlock(self, aid: str, tid: str, user: str) -> str:
        try:
            return "unlocked" if await self.teams.seats.unlock(aid, tid, user) else "no_lock"
        except errors.GroupBuyError as exc:
            return exc.code

    async def confirm(self, aid: str, tid: str, user: str) -> str:
        try:
            await self.teams.seats.confirm(aid, tid, user, f"o-{user}")
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

    over_capacity and double_locks are violations summed over every snapshot taken.
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
    await services.teams.activities.create_activity(aid, team_size=TEAM_SIZE)
    teams = [f"t{i}" for i in range(sizes.teams)]
    await gather_limited(
        [partial(services.teams.activities.open_team, aid, f"lead-{t}", team_id=t) for t in teams]
    )
    pairs = [(aid, t) for t in teams]
    sampler = Sampler(lambda: groupbuy_snapshot(services, pairs))
    seconds, meter, outcomes = await storm(GroupbuyTeams(services), aid, teams, sizes, sampler)
    correct = storm_correct(outcomes, GroupbuyTeams.EXPECTED, await sampler.stop())
    note = (
        f"{sizes.teams} teams of {TEAM_SIZE}, {sizes.storm_users} users x {sizes.storm_steps} "
        f"ops (lock 70/unlock 15/confirm 15), {CONCURRENCY} concurrent; TeamService "
        "(confirm also flushes the outbox to SQLite and reads the team); over_capacity and "
        "double_locks are violations summed over all snapshots (one script each)"
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
