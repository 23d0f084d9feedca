"""Real concurrency on a real redis-server and on a 3-master Redis Cluster: the seat-lock
guarantees of SPEC §4 (1, 2)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import pytest

from groupbuy import errors
from groupbuy.services import Services
from tests.support.backends import CLUSTER, REAL, WHERE
from tests.support.seats import check_seat_snapshot, seat_snapshot

pytestmark = [pytest.mark.parametrize("backend", [REAL, CLUSTER])]

CLIENTS = 250
TEAMS = 12
STORM_STEPS = 30


async def _attempt(services: Services, aid: str, tid: str, user: str, start: asyncio.Event) -> str:
    await start.wait()
    try:
        outcome = await services.teams.seats.lock(aid, tid, user)
    except errors.TeamFull:
        return "team_full"
    return "locked" if outcome.created else "existing"


async def test_many_clients_race_for_one_team(
    services: Services, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    """250 clients at once on each 3-seat team: exactly 2 locks (the leader holds seat 1)."""
    await services.teams.activities.create_activity("race", team_size=3)
    total_ops, total_s = 0, 0.0
    for round_no in range(TEAMS):
        tid = f"team{round_no}"
        await services.teams.activities.open_team("race", f"leader{round_no}", team_id=tid)
        start = asyncio.Event()
        tasks = [
            asyncio.create_task(_attempt(services, "race", tid, f"r{round_no}u{i}", start))
            for i in range(CLIENTS)
        ]
        await asyncio.sleep(0.05)  # every task is waiting on the event
        began = time.perf_counter()
        start.set()
        results = Counter(await asyncio.gather(*tasks))
        total_s += time.perf_counter() - began
        total_ops += CLIENTS
        assert results == {"locked": 2, "team_full": CLIENTS - 2}, results
        team = await services.teams.activities.get_team("race", tid)
        assert len(team["locks"]) == 2 and team["free_seats"] == 0
    with capsys.disabled():
        print(
            f"\n[figures] lock race: {total_ops} lock calls by {CLIENTS} concurrent clients, "
            f"{total_ops / total_s:,.0f} locks/s on {WHERE[backend]}"
        )


async def test_switching_storm_never_overfills_or_doubles(
    services: Services, redis_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Users lock, switch, unlock and confirm across teams while snapshots check the invariants."""
    aid = "storm"
    await services.teams.activities.create_activity(aid, team_size=6)
    teams = [f"s{i}" for i in range(40)]
    for tid in teams:
        await services.teams.activities.open_team(aid, f"lead-{tid}", team_id=tid)
    users = [f"user{i}" for i in range(200)]
    outcomes: Counter[str] = Counter()
    stop = asyncio.Event()
    rng = random.Random(20261121)

    async def shopper(user: str) -> None:
        holding: str | None = None
        for step in range(STORM_STEPS):
            roll = rng.random()
            try:
                if holding and roll < 0.03:
                    await services.teams.seats.confirm(aid, holding, user, f"o-{user}-{step}")
                    outcomes["confirmed"] += 1
                    holding = None
                elif holding and roll < 0.15:
                    await services.teams.seats.unlock(aid, holding, user)
                    outcomes["unlock"] += 1
                    holding = None
                else:
                    tid = rng.choice(teams)
                    outcome = await services.teams.seats.lock(aid, tid, user)
                    outcomes["switched" if outcome.body["released_team_id"] else "locked"] += 1
                    holding = tid
            except errors.GroupBuyError as exc:
                outcomes[exc.code] += 1

    async def sampler() -> int:
        samples = 0
        while not stop.is_set():
            now_ms, replies = await seat_snapshot(redis_client, services, aid, teams)
            check_seat_snapshot(now_ms, replies, teams)
            samples += 1
            await asyncio.sleep(0)
        return samples

    sampling = asyncio.create_task(sampler())
    began = time.perf_counter()
    await asyncio.gather(*(shopper(user) for user in users))
    elapsed = time.perf_counter() - began
    stop.set()
    samples = await sampling
    now_ms, replies = await seat_snapshot(redis_client, services, aid, teams)
    check_seat_snapshot(now_ms, replies, teams)

    operations = sum(outcomes.values())
    assert operations == len(users) * STORM_STEPS
    assert samples >= 10 and outcomes["switched"] > 0 and outcomes["team_full"] > 0, outcomes
    # Membership is exact: nobody twice in a team, formed teams full, counts agree with SQL later.
    for tid in teams:
        team = await services.teams.activities.get_team(aid, tid)
        members = [m["user_id"] for m in team["members"]]
        assert len(members) == len(set(members)) <= team["size"]
        assert (
            len(members) + len(team["locks"]) + team["free_seats"] == team["size"]
            or team["status"] != "open"
        )
    with capsys.disabled():
        print(
            f"\n[figures] switching storm: {operations} operations by {len(users)} users in "
            f"{elapsed:.2f}s = {operations / elapsed:,.0f} ops/s, "
            f"{samples} atomic snapshots checked; "
            f"outcomes {dict(outcomes)}"
        )


async def test_formed_is_told_to_exactly_one_confirm_per_team(
    services: Services, capsys: pytest.CaptureFixture[str]
) -> None:
    """Teams of 4 with 3 lockers each: all confirms at once, each sent twice (a client's
    retry racing its first attempt); `formed: true` reaches exactly one confirmer per team,
    and that confirmer's repeats say so too, nobody else's."""
    teams = services.teams
    await teams.activities.create_activity("f", team_size=4)
    count = 40
    calls = []
    for t in range(count):
        await teams.activities.open_team("f", f"L{t}", team_id=f"t{t}")
        for u in range(3):
            await teams.seats.lock("f", f"t{t}", f"t{t}u{u}")
            calls += [(f"t{t}", f"t{t}u{u}")] * 2
    random.Random(7).shuffle(calls)

    async def confirm(tid: str, user: str) -> tuple[str, str, bool]:
        outcome = await teams.seats.confirm("f", tid, user, f"o-{user}")
        return tid, user, bool(outcome.body["formed"])

    answers = await asyncio.gather(*(confirm(t, u) for t, u in calls))
    formers = {(t, u) for t, u, formed in answers if formed}
    assert len({t for t, _u in formers}) == count and len(formers) == count
    for tid, user, formed in answers:  # both answers of a confirmer agree
        assert formed == ((tid, user) in formers)
    for t in range(count):
        assert (await teams.activities.get_team("f", f"t{t}"))["status"] == "formed"
    with capsys.disabled():
        print(
            f"\n[figures] formed race: {len(calls)} confirms (each sent twice) on {count} teams: "
            f"{sum(f for _t, _u, f in answers)} answers said formed, by {len(formers)} confirmers"
        )


async def test_versions_seen_by_concurrent_callers_are_distinct_and_count_the_changes(
    services: Services,
) -> None:
    """120 shoppers race for 49 seats, then 30 holders pay and 19 let go, all at once: every
    answer that changed the team saw its own version, and the final version is the count of
    changes (open + locks + releases + members)."""
    teams = services.teams
    await teams.activities.create_activity("v", team_size=50)
    await teams.activities.open_team("v", "L", team_id="t")

    async def try_lock(user: str) -> int | None:
        try:
            return int((await teams.seats.lock("v", "t", user)).body["version"])
        except errors.TeamFull:
            return None

    locked = await asyncio.gather(*(try_lock(f"u{i}") for i in range(120)))
    holders = [f"u{i}" for i, v in enumerate(locked) if v is not None]
    assert len(holders) == 49
    payers, leavers = holders[:30], holders[30:]

    async def pay(user: str) -> int:
        outcome = await teams.seats.confirm("v", "t", user, f"o-{user}")
        return int(outcome.body["team"]["version"])

    paid = await asyncio.gather(
        *(pay(u) for u in payers), *(teams.seats.unlock("v", "t", u) for u in leavers)
    )
    seen = [v for v in locked if v is not None] + [int(v) for v in paid[: len(payers)]]
    assert len(seen) == len(set(seen)) == 79
    assert all(paid[len(payers) :])  # every release released
    team = await teams.activities.get_team("v", "t")
    assert team["version"] == 1 + 49 + 19 + 30
