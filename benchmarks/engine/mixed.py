"""mixed: 20 activities and 50 packets at once, grabs and seat locks interleaved."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from functools import partial
from typing import Any

from benchmarks.engine.common import TEAM_SIZE, Sizes, grade_grabs, groupbuy_grab, make_row
from benchmarks.engine.lock_storm import (
    GroupbuyTeams,
    Sampler,
    Shopper,
    groupbuy_snapshot,
    storm_correct,
)
from benchmarks.measure import CONCURRENCY, Meter, gather_limited
from groupbuy.services import Services

MIXED_ACTIVITIES, MIXED_TEAMS, MIXED_PACKETS, MIXED_SHARES = 20, 10, 50, 100


async def mixed_setup(services: Services, run: str) -> tuple[list[str], list[str], list[str]]:
    """20 activities x 10 teams and 50 packets x 100 shares."""
    activities = [f"mix{i}-{run}" for i in range(MIXED_ACTIVITIES)]
    teams = [f"t{i}" for i in range(MIXED_TEAMS)]
    packets = [f"mixp{i}-{run}" for i in range(MIXED_PACKETS)]
    for aid in activities:
        await services.teams.activities.create_activity(aid, team_size=TEAM_SIZE)
    await gather_limited(
        [
            partial(services.teams.activities.open_team, a, f"lead-{t}", team_id=t)
            for a in activities
            for t in teams
        ]
    )
    sender, amount = f"mixsender-{run}", MIXED_SHARES * 100
    await services.packets.accounts.deposit(sender, amount * MIXED_PACKETS, f"mix-{run}")
    for pid in packets:
        await services.packets.sending.send(sender, amount, MIXED_SHARES, packet_id=pid)
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
